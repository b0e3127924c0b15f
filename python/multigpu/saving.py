"""Saving and loading models, around Keras 3.15's legacy-HDF5 alias bug.

Keras 3.15 saves `compile(loss="mse")` into a legacy `.h5` file and then
refuses to load it compiled ("Could not deserialize 'keras.metrics.mse'
because it is not a KerasSaveable subclass"): the string alias resolves to a
function, which its safe deserialiser rejects. The R package's
`save_model_hdf5()` / `load_model_hdf5()` pair (seed 000's way of saving)
meets this with the most common loss. `save_model` writes `.h5` files whose
training configuration names every loss and metric canonically, so stock
`keras.models.load_model` loads them compiled; `load_model` also reads files
written by Keras itself.
"""

import inspect
import json
import os
import zipfile

import h5py
import keras

from multigpu import internals
from multigpu.messages import literal

_ALIAS_BUG = "is not a KerasSaveable subclass"


def _is_hdf5(filepath):
    return str(filepath).endswith((".h5", ".hdf5"))


def _compile_argument(config, deserialize):
    """Strings stay strings (compile resolves them); objects deserialise."""
    if config is None or isinstance(config, str):
        return config
    if isinstance(config, dict) and "class_name" in config:
        return deserialize(config)
    if isinstance(config, dict):
        return {k: _compile_argument(v, deserialize) for k, v in config.items()}
    return [_compile_argument(v, deserialize) for v in config]


def _compile_from_hdf5(model, filepath):
    with h5py.File(filepath, "r") as h5:
        config = json.loads(h5.attrs["training_config"])
        model.compile(
            optimizer=keras.optimizers.deserialize(config["optimizer_config"]),
            loss=_compile_argument(config.get("loss"), keras.losses.deserialize),
            metrics=_compile_argument(
                config.get("metrics"), keras.metrics.deserialize),
            weighted_metrics=_compile_argument(
                config.get("weighted_metrics"), keras.metrics.deserialize),
            loss_weights=config.get("loss_weights"),
        )
        if "optimizer_weights" in h5:
            model.optimizer.build(model.trainable_variables)
            model.optimizer.set_weights(
                internals.optimizer_weights_from_hdf5(h5))
    return model


# Metric strings that Keras's legacy loader keeps as strings for `compile`.
_KEPT_METRICS = ("accuracy", "acc", "crossentropy", "ce")


def _canonical(obj):
    """A built-in loss/metric as its loadable name or serialised object."""
    if inspect.isfunction(obj):
        return obj.__name__
    return keras.saving.serialize_keras_object(obj)


def _loadable_loss(name):
    try:
        if callable(keras.losses.deserialize(name)):
            return name
    except (ValueError, TypeError):
        pass
    return _canonical(keras.losses.get(name))


def _loadable_metric(name):
    """A metric string as the metric object `compile` makes of it.

    Keras's loader turns `"mae"` into a metric named `mean_absolute_error`;
    the object keeps the name `compile` gave it (so `history` and
    `evaluate` keep their keys).
    """
    if name in _KEPT_METRICS:
        return name
    try:
        metric = keras.metrics.deserialize(name)
    except (ValueError, TypeError):
        metric = keras.metrics.get(name)
    if not isinstance(metric, keras.metrics.Metric):
        return _canonical(metric)
    config = metric.get_config()
    config["name"] = name
    return {"class_name": type(metric).__name__, "config": config}


def _map_strings(config, fn):
    if isinstance(config, str):
        return fn(config)
    if isinstance(config, dict) and "class_name" not in config:
        return {k: _map_strings(v, fn) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [_map_strings(v, fn) for v in config]
    return config


def loadable_training_config(config):
    """A legacy training configuration with canonical loss/metric names.

    Loss aliases that Keras's legacy loader cannot deserialise (`"mse"`,
    `"mae"`, ...) become the name of the function they stand for
    (`"mean_squared_error"`); metric strings become the metric object that
    `compile` makes of them, with the same name (`"mae"` stays the name of
    the metric, which Keras's loader would rename `mean_absolute_error`).

    Args:
        config: The decoded `training_config` attribute of an `.h5` file.

    Returns:
        A new dict; the compiled model it describes is the same.

    Example:
    >>> loadable_training_config({"loss": "mse", "metrics": ["mae"]})["loss"]
    'mean_squared_error'
    """
    config = dict(config)
    if config.get("loss") is not None:
        config["loss"] = _map_strings(config["loss"], _loadable_loss)
    for key in ("metrics", "weighted_metrics"):
        if config.get(key) is not None:
            config[key] = _map_strings(config[key], _loadable_metric)
    return config


def save_model(model, filepath, overwrite=True, **kwargs):
    """Saves `model` like `model.save`, in files stock Keras loads compiled.

    A compiled model saved to a legacy `.h5` file gets a training
    configuration that names its losses and metrics canonically (see
    `loadable_training_config`), so `keras.models.load_model` restores it
    compiled, with its optimizer state, whatever aliases `compile` used.
    Other formats are written by Keras unchanged.

    Args:
        model: A Keras model (a parallel model saves its template).
        filepath: A `.keras` or `.h5`/`.hdf5` path.
        overwrite: Whether to replace an existing file.
        **kwargs: Passed on to `model.save` (e.g. `include_optimizer`).

    Returns:
        None.

    Example:
    >>> model.compile(optimizer="adam", loss="mse")
    >>> multigpu.save_model(model, "m.h5")
    >>> keras.models.load_model("m.h5").optimizer.iterations
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `model`: received an object of type "
            f"{type(model).__name__}; expected a keras.Model to save."
        )
    model.save(filepath, overwrite=overwrite, **kwargs)
    if not _is_hdf5(filepath):
        return
    with h5py.File(filepath, "r+") as h5:
        if "training_config" not in h5.attrs:
            return
        config = json.loads(h5.attrs["training_config"])
        h5.attrs["training_config"] = json.dumps(
            loadable_training_config(config)).encode("utf-8")


def _model_files(directory):
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [n for n in names if n.endswith(_MODEL_EXTENSIONS)
            and os.path.isfile(os.path.join(directory, n))]


_MODEL_EXTENSIONS = (".keras", ".h5", ".hdf5")


def check_model_file(filepath):
    """Refuses a path that is no Keras model file.

    Keras reports a file of another kind (or a truncated one) as "File not
    found", a directory as an unsupported format and `None` with a bare
    `TypeError`; this names what is wrong and the fix instead. A missing
    path is left to Keras, whose message then is right.

    Args:
        filepath: The path given to `load_model`.

    Raises:
        TypeError: if `filepath` is not a path (`None`, a number).
        ValueError: if `filepath` is empty, a directory, or a file that is
            neither a `.keras` (zip) archive nor an HDF5 file.

    Example:
    >>> check_model_file("model.keras")   # a file model.save() wrote: passes
    """
    if not isinstance(filepath, (str, bytes, os.PathLike)):
        raise TypeError(
            f"Invalid `filepath`: received {literal(filepath)}; expected the "
            "path of a saved model file (.keras, or .h5/.hdf5)."
        )
    path = os.fsdecode(os.fspath(filepath))
    if not path:
        raise ValueError(
            f"Invalid `filepath`: received {literal(path)}; expected the path "
            "of a saved model file (.keras, or .h5/.hdf5)."
        )
    if os.path.isdir(path):
        inside = _model_files(path)
        if os.path.exists(os.path.join(path, "saved_model.pb")):
            fix = ("It holds a TensorFlow SavedModel, which Keras 3 loads "
                   "for inference only, with keras.layers.TFSMLayer(path, "
                   "call_endpoint='serving_default').")
        elif inside:
            shown = ", ".join(literal(n) for n in inside[:3])
            more = f" and {len(inside) - 3} more" if len(inside) > 3 else ""
            fix = f"It holds the model files {shown}{more}: pass one of them."
        else:
            fix = "Pass the path of a file written by saving a model."
        raise ValueError(
            f"Invalid `filepath`: received {literal(path)}, which is a "
            f"directory; expected a saved model file (.keras, or .h5/.hdf5). "
            f"{fix}"
        )
    if not os.path.isfile(path):
        return
    if zipfile.is_zipfile(path) or h5py.is_hdf5(path):
        return
    raise ValueError(
        f"Invalid `filepath`: {literal(path)} is not a Keras model file: "
        "neither a .keras (zip) archive nor an HDF5 (.h5) file; it may be "
        "truncated or of another kind. Load a file written by saving a model."
    )


def load_model(filepath, custom_objects=None, compile=True, **kwargs):
    """Loads a saved Keras model, like `keras.models.load_model`.

    For a legacy `.h5` file that Keras 3.15 cannot compile because its loss
    or metrics are string aliases such as `"mse"`, the model is loaded
    uncompiled and compiled from the file's training configuration, with its
    optimizer state.

    Args:
        filepath: A `.keras` or `.h5`/`.hdf5` file.
        custom_objects: Optional dict of custom classes or functions.
        compile: Whether to compile the loaded model as it was saved.
        **kwargs: Passed on to `keras.models.load_model`.

    Returns:
        The loaded `keras.Model`.

    Raises:
        TypeError: if `filepath` is not a path.
        ValueError: if `filepath` is empty, a directory, or a file that is
            no Keras model file (see `check_model_file`).

    Example:
    >>> model.compile(optimizer="adam", loss="mse"); model.save("m.h5")
    >>> multigpu.load_model("m.h5").optimizer.iterations
    """
    check_model_file(filepath)
    try:
        return keras.models.load_model(
            filepath, custom_objects=custom_objects, compile=compile, **kwargs)
    except ValueError as error:
        if not (compile and _is_hdf5(filepath) and _ALIAS_BUG in str(error)):
            raise
    model = keras.models.load_model(
        filepath, custom_objects=custom_objects, compile=False, **kwargs)
    with keras.saving.custom_object_scope(custom_objects or {}):
        return _compile_from_hdf5(model, filepath)
