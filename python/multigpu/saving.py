"""Loading saved models, with Keras 3.15's legacy-HDF5 loss-alias bug fixed.

Keras 3.15 saves `compile(loss="mse")` into a legacy `.h5` file and then
refuses to load it compiled ("Could not deserialize 'keras.metrics.mse'
because it is not a KerasSaveable subclass"): the string alias resolves to a
function, which its safe deserialiser rejects. The R package's
`save_model_hdf5()` / `load_model_hdf5()` pair (seed 000's way of saving)
meets this with the most common loss, so loading goes through here.
"""

import json

import h5py
import keras
from keras.src.legacy.saving import legacy_h5_format

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
                legacy_h5_format.load_optimizer_weights_from_hdf5_group(h5))
    return model


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

    Example:
    >>> model.compile(optimizer="adam", loss="mse"); model.save("m.h5")
    >>> multigpu.load_model("m.h5").optimizer.iterations
    """
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
