"""The data given to the engines' `fit`, `evaluate` and `predict`, checked first.

Keras answers some bad data late and unclearly, and through an engine
(batches sliced between devices, or a `tf.distribute` strategy) less
clearly still: `fit` of 0 rows returns an empty history, `predict` of 0 rows
raises `UnboundLocalError`, the mirrored engine a bare `StopIteration`; a
ragged tensor fails in a replica's gradient with `AttributeError ... 'op'`;
labels out of range abort a step on a CPU and give NaN on a GPU; class
weights keyed by strings are silently ignored, and `batch_size=0` silently
means 32.

`checked_call` runs one of those methods of a model of this package
(`multigpu.engines.template.TemplateBacked`) with its arguments checked first. Each check
refuses one kind of input with a `ValueError` that names the argument, the
value and the fix; inputs Keras refuses clearly itself are left to Keras,
and plain Keras models are not touched. It imports no TensorFlow: every
engine checks its data here, and a TensorFlow value (`is_tensorflow`) is
recognised only once TensorFlow is imported. `check_rows` also serves
`placement_report`, `check_batched` `fit_distributed`. `bound_arguments`
names the arguments of a call of a `keras.Model` method, for the checks
here and for the engines that rewrite `fit`'s or `compile`'s arguments.
"""

import inspect
import numbers
import operator

import keras
import numpy as np

from multigpu import internals
from multigpu.arguments import check_int, is_int
from multigpu.messages import (
    R_NA_INTEGER,
    api,
    current_language,
    literal,
    literals,
    setting,
)
from multigpu.runtime import loaded_tensorflow

# What each method would do with no data, after "expected at least one row:".
_NOTHING = {
    "fit": "fit() would train on nothing and return an empty history",
    "evaluate": "evaluate() would have nothing to evaluate",
    "predict": "predict() would have nothing to predict",
    "train_on_batch": "train_on_batch() would train on nothing",
    "test_on_batch": "test_on_batch() would have nothing to evaluate",
    "placement_report": "placement_report() observes one step on the batch",
    "validation": "fit() would skip validation without a word",
}
_VERB = {"fit": "train on", "evaluate": "evaluate", "predict": "predict",
         "validation": "validate on"}
_CHECK_DATA = "Check how the data was read, filtered or split."
_SHOWN = 5


def is_tensorflow(value, *classes):
    """Whether `value` is an instance of one of TensorFlow's `classes`.

    Without importing TensorFlow: a TensorFlow value exists only once it
    is imported, so on JAX without TensorFlow the answer is False.

    Args:
        value: Anything.
        *classes: Attribute paths below `tf`, e.g. `"data.Dataset"`.

    Returns:
        A bool.

    Example:
    >>> is_tensorflow(np.zeros(3), "Tensor")
    False
    """
    tf = loaded_tensorflow()
    if tf is None:
        return False
    return isinstance(value, tuple(operator.attrgetter(name)(tf)
                                   for name in classes))


def is_dataset(value):
    """Whether `value` is a `tf.data.Dataset` (False without TensorFlow)."""
    return is_tensorflow(value, "data.Dataset")


def bound_arguments(method, model, args=(), kwargs=None, defaults=False):
    """The arguments of `keras.Model.<method>(model, *args, **kwargs)` by name.

    Keras's signature of the method binds them: positional arguments get
    their parameter's name, and the method's `**kwargs` are merged in.

    Args:
        method: The name of a `keras.Model` method: `"fit"`, `"compile"`,
            `"evaluate"`, ...
        model: The model the method is called on (bound as `self`, which
            the result leaves out).
        args: The positional arguments of the call.
        kwargs: Its keyword arguments.
        defaults: Also give the parameters the call leaves out, with their
            defaults.

    Returns:
        A new dict of argument names to values.

    Raises:
        TypeError: if the arguments do not fit Keras's signature (callers
            that leave the call to Keras report nothing themselves).

    Example:
    >>> bound_arguments("fit", model, (x, y, 32))["batch_size"]
    32
    """
    bound = inspect.signature(getattr(keras.Model, method)).bind(
        model, *args, **(kwargs or {}))
    if defaults:
        bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop("self")
    arguments.update(arguments.pop("kwargs", None) or {})
    return arguments


def _bound(method, model, args, kwargs):
    """The arguments of `model.<method>(*args, **kwargs)` by name, or None.

    None when they do not fit Keras's signature: Keras reports that itself.
    """
    try:
        return bound_arguments(method, model, args, kwargs, defaults=True)
    except TypeError:
        return None


def _shape(leaf):
    """`leaf`'s shape as a tuple (None for unknown sizes), or None."""
    if is_dataset(leaf):
        return None
    shape = getattr(leaf, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(None if d is None else int(d) for d in shape)
    except (TypeError, ValueError):  # unknown rank
        return None


def _row_counts(value):
    return {shape[0] for shape in map(_shape, keras.tree.flatten(value))
            if shape and shape[0] is not None}


def _has_unknown_size(value):
    """Whether `value` is data whose rows only iterating it shows."""
    return value is not None and not _row_counts(value)


def _text(shape):
    return str(tuple(shape))


def _values(values):
    """Up to `_SHOWN` values as prose: `3`, `3 and 4`, `-1, 3, and 7`."""
    values = [int(v) if float(v).is_integer() else float(v) for v in values]
    text = literals(values[:_SHOWN], "and")
    if len(values) > _SHOWN:
        text += f" (and {len(values) - _SHOWN} more)"
    return text


def check_rows(name, value, method):
    """Refuses data of no rows: arrays of 0 rows, a dataset of 0 batches.

    Args:
        name: The argument's name, for the message (`"x"`).
        value: Arrays or tensors (or a structure of them), a
            `tf.data.Dataset`, or anything else (not checked).
        method: What the data is for: `"fit"`, `"evaluate"`, `"predict"`,
            `"train_on_batch"`, `"test_on_batch"`, `"placement_report"` or
            `"validation"` (fit's `validation_data`).

    Raises:
        ValueError: naming `name`, the 0 rows and the fix.

    Example:
    >>> check_rows("x", np.zeros((0, 4)), "predict")
    Traceback (most recent call last):
    ValueError: Invalid `x`: received 0 rows; expected at least one row: ...
    """
    if is_dataset(value):
        if int(value.cardinality()) == 0:
            raise ValueError(
                f"Invalid `{name}`: received a tf.data.Dataset of 0 batches; "
                f"expected at least one batch: {_NOTHING[method]}. "
                f"{_CHECK_DATA}")
        return
    if _row_counts(value) == {0}:
        raise ValueError(
            f"Invalid `{name}`: received 0 rows; expected at least one row: "
            f"{_NOTHING[method]}. {_CHECK_DATA}")


def no_batch_error(name, method):
    """The error for a dataset (of unknown size) that yielded no batch."""
    return ValueError(
        f"Invalid `{name}`: the dataset yielded no batch, so "
        f"{'fit' if method == 'validation' else method}() had nothing to "
        f"{_VERB[method]}; expected at least one batch. Check the dataset's "
        f"size and its filters, and {setting('drop_remainder', True)} with "
        "fewer rows than one batch.")


def check_batch_size(value, name="batch_size"):
    """`value` as None or an int >= 1 (Keras reads 0 as its default, 32)."""
    if value is None:
        return None
    return check_int(name, value, 1, expected=(
        f"{literal(None)} (Keras's default, 32 rows) or an int >= 1 (rows "
        "per step, split between the devices)"))


def _ragged_error(name):
    if current_language() == "r":
        padding = ("the tensor's to_tensor() method pads with zeros (for "
                   "sequences, pad_sequences()), and layer_masking() or "
                   "layer_embedding(mask_zero = TRUE) ignores the padding")
    else:
        padding = ("the tensor's to_tensor() method pads with zeros (for "
                   "sequences, keras.utils.pad_sequences), and a Masking "
                   "layer or an Embedding with mask_zero=True ignores the "
                   "padding")
    return ValueError(
        f"Invalid `{name}`: received a tf.RaggedTensor (rows of different "
        "lengths); the engines cut every batch into sub-batches of rows, "
        f"which needs rows of one shape. Pad the rows to one length first: "
        f"{padding}.")


def _check_dense(name, value, model):
    if any(getattr(t, "ragged", False) for t in _model_inputs(model)):
        return
    if any(is_tensorflow(leaf, "RaggedTensor", "RaggedTensorSpec")
           for leaf in keras.tree.flatten(value)):
        raise _ragged_error(name)


def _string_dtype(leaf):
    """The dtype of `leaf` as text if it holds strings, else None."""
    if isinstance(leaf, np.ndarray):
        if leaf.dtype.kind in "US" or (
                leaf.dtype.kind == "O" and leaf.size
                and isinstance(leaf.flat[0], (str, bytes))):
            return str(leaf.dtype)
        return None
    dtype = getattr(leaf, "dtype", None)
    if is_tensorflow(dtype, "DType") and dtype.name == "string":
        return "string"
    return None


def _model_inputs(model):
    try:
        return keras.tree.flatten(model.inputs)
    except (AttributeError, ValueError):  # a model without a graph
        return []


def _check_numeric_x(name, x, model):
    inputs = _model_inputs(model)
    if not inputs or any("string" in str(t.dtype) for t in inputs):
        return
    for leaf in keras.tree.flatten(x):
        dtype = _string_dtype(leaf)
        if dtype:
            takes = ", ".join(sorted({str(t.dtype) for t in inputs}))
            raise ValueError(
                f"Invalid `{name}`: received strings (dtype {dtype}), but the "
                f"model's inputs take numbers ({takes}). Encode text and "
                "categories as numbers first, e.g. with a "
                "keras.layers.StringLookup or TextVectorization in the input "
                "pipeline.")


def check_numeric_y(name, y):
    """Refuses string targets, naming `name` and how to encode them.

    Raises:
        ValueError: if a leaf of `y` holds strings.
    """
    for leaf in keras.tree.flatten(y):
        dtype = _string_dtype(leaf)
        if dtype:
            raise ValueError(
                f"Invalid `{name}`: received strings (dtype {dtype}) as "
                "targets; losses compute on numbers. Map each class to an "
                "integer index from 0 (the classes in a fixed order) first.")


def _per_output(value, names, broadcast):
    """`value` as one entry per output name, or None if it does not map.

    A dict keyed by output names, or a list of one entry per output; any
    other value is every output's when `broadcast`, else the only output's.
    """
    if isinstance(value, dict):
        if value and set(value) <= set(names):
            return [value.get(name) for name in names]
        return None
    if isinstance(value, (list, tuple)) and len(names) > 1:
        return list(value) if len(value) == len(names) else None
    if broadcast or len(names) == 1:
        return [value] * len(names)
    return None


def _sparse_loss(loss):
    """`(True, ignore_class)` for a sparse categorical loss, else `(False, None)`."""
    if isinstance(loss, str):
        return loss in ("sparse_categorical_crossentropy",
                        "SparseCategoricalCrossentropy"), None
    if isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
        return True, loss.get_config().get("ignore_class")
    return getattr(loss, "__name__", None) == "sparse_categorical_crossentropy", None


def _numbers(leaf):
    """`leaf` as a NumPy array of numbers, or None (strings, datasets, ...)."""
    if not (isinstance(leaf, np.ndarray) or is_tensorflow(leaf, "Tensor")) or (
            is_tensorflow(leaf, "RaggedTensor")):
        return None
    try:
        array = np.asarray(leaf)
    except (TypeError, ValueError):  # a symbolic tensor
        return None
    return array if array.dtype.kind in "iuf" else None


def _outputs(model):
    try:
        return list(model.output_names), [t.shape for t in model.outputs]
    except (AttributeError, ValueError):
        return [], []


def _check_labels(name, model, y):
    """Labels of sparse categorical losses: class indices of the output."""
    names, shapes = _outputs(model)
    losses = _per_output(getattr(model, "loss", None), names, broadcast=True)
    targets = _per_output(y, names, broadcast=False)
    if not names or losses is None or targets is None:
        return
    for output, shape, loss, target in zip(names, shapes, losses, targets):
        sparse, ignore = _sparse_loss(loss)
        labels = _numbers(target) if sparse else None
        if labels is None or not labels.size or shape[-1] is None:
            continue
        _check_class_indices(name, output, int(shape[-1]), labels, ignore)


def check_no_r_na(name, values):
    """Refuses R's integer NA, which reaches Python as the int32 -2^31.

    A double NA arrives as NaN (the NaN checks name it); an integer or
    factor NA would pass as the number -2147483648.

    Raises:
        ValueError: naming the argument, how many rows hold NA, the first
            one (counted from 1) and the fix, when called from R.
    """
    values = np.asarray(values)
    if current_language() != "r" or values.dtype != np.int32 or not values.ndim:
        return
    missing = (values.reshape(len(values), -1) == R_NA_INTEGER).any(axis=1)
    if missing.any():
        raise ValueError(
            f"Invalid `{name}`: received NA in {int(missing.sum())} of "
            f"{len(values)} rows (the first is row {int(np.argmax(missing)) + 1}); "
            "Keras cannot train on a missing value. Remove those rows from "
            f"x and y first, e.g. keep <- !is.na({name}), or impute them.")


def _check_class_indices(name, output, classes, labels, ignore):
    check_no_r_na(name, labels)
    rows = labels.shape[0] if labels.ndim else 1
    by_row = labels.reshape(rows, -1).astype("float64")
    considered = np.isfinite(by_row)  # NaN and inf: multigpu.step.nonfinite's
    if ignore is not None:
        considered &= by_row != ignore
    values = by_row[considered]
    what = (f"output {literal(output)} has {classes} classes, so its labels "
            f"are class indices from 0 to {classes - 1}")
    fractional = np.unique(values[values != np.round(values)])
    if fractional.size:
        raise ValueError(
            f"Invalid `{name}`: {what}; received non-integer labels "
            f"{_values(fractional)}. Map each class to an integer index "
            "from 0 first.")
    wrong = considered & ((by_row < 0) | (by_row >= classes))
    if wrong.any():
        bad_rows = int(wrong.any(axis=1).sum())
        raise ValueError(
            f"Invalid `{name}`: {what}; received {_values(np.unique(by_row[wrong]))} "
            f"(in {bad_rows} of {rows} rows). Count the classes from 0 "
            "(labels counted from 1 need 1 subtracted), or give the output "
            "one unit per class.")


def _check_sample_weight(name, model, sample_weight):
    """Weights of one output: one per row, or one per row and time step."""
    shape = _shape(sample_weight) if isinstance(sample_weight, np.ndarray) or (
        is_tensorflow(sample_weight, "Tensor")) else None
    names, shapes = _outputs(model)
    if not shape or len(names) != 1:
        return
    dims = shape[1:]
    while dims and dims[-1] == 1:
        dims = dims[:-1]
    per_row = tuple(shapes[0][1:-1])  # the loss: one value per row (and step)
    if len(dims) <= len(per_row) and all(
            p is None or p == d for d, p in zip(dims, per_row)):
        return
    expected = f"one weight per row, shape {_text((shape[0],))}"
    if per_row:
        expected += (", or one per row and step, shape "
                     f"{_text((shape[0],) + per_row)}")
    raise ValueError(
        f"Invalid `{name}`: received an array of shape {_text(shape)}; "
        f"expected {expected}: the loss of output {literal(names[0])} has "
        "one value per row" + (" and step" if per_row else "") + ".")


def _class_weight_example():
    if current_language() == "r":
        return 'c("0" = 1, "1" = 5)'
    return "{0: 1.0, 1: 5.0}"


def _classes_in(y):
    """The classes `y` holds, read as Keras reads them for class weights."""
    labels = _numbers(y)
    if labels is None or not labels.size:
        return None
    if labels.ndim > 1 and labels.shape[-1] != 1:
        labels = np.argmax(labels, axis=-1)
    finite = labels[np.isfinite(labels)] if labels.dtype.kind == "f" else labels
    return {int(c) for c in np.unique(np.round(finite))}


def _check_class_weight(model, class_weight, x, y):
    if class_weight is None:
        return
    example = _class_weight_example()
    if not isinstance(class_weight, dict) or not class_weight:
        raise ValueError(
            f"Invalid `class_weight`: received {literal(class_weight)}; "
            "expected None or a dict that maps every class index to its "
            f"weight, e.g. {example}.")
    keys = [k for k in class_weight if not is_int(k)]
    if keys:
        raise ValueError(
            "Invalid `class_weight`: its keys must be class indices (ints); "
            f"received {literals(keys, 'and')}. Keras silently ignores any "
            f"other key, a string such as {literal('0')} included; e.g. "
            f"{example}.")
    weights = {int(k): v for k, v in class_weight.items()}
    bad = {k: v for k, v in weights.items()
           if isinstance(v, bool) or not isinstance(v, numbers.Real)
           or not np.isfinite(v) or v < 0}
    if bad:
        raise ValueError(
            "Invalid `class_weight`: the weights must be numbers >= 0; "
            f"received {literal(bad)}.")
    names, shapes = _outputs(model)
    if len(names) != 1 or shapes[0][-1] is None:
        return  # several outputs: Keras refuses class weights itself
    classes = max(int(shapes[0][-1]), 2)  # one sigmoid unit: classes 0 and 1
    unknown = sorted(k for k in weights if not 0 <= k < classes)
    if unknown:
        raise ValueError(
            f"Invalid `class_weight`: it has a weight for class "
            f"{_values(unknown)}, but output {literal(names[0])} has "
            f"{classes} classes (0 to {classes - 1}).")
    present = _classes_in(y)
    if present is not None:
        missing = sorted(present - set(weights))
        where = ", which `y` holds"
    elif is_dataset(x):
        missing = sorted(set(range(classes)) - set(weights))
        where = f" of output {literal(names[0])} ({classes} classes)"
    else:
        return
    if missing:
        raise ValueError(
            f"Invalid `class_weight`: it has no weight for class "
            f"{_values(missing)}{where}; give every class a weight (1 "
            f"leaves a class as it is), e.g. {example}.")


def check_batched(name, dataset, model):
    """Refuses a dataset of single examples where batches are expected.

    Args:
        name: The argument's name, for the message.
        dataset: Anything; only a `tf.data.Dataset` is checked.
        model: The model that will take its batches.

    Raises:
        ValueError: if every input's elements have one dimension fewer
            than the model's input (no batch dimension), or are ragged.
    """
    if not is_dataset(dataset):
        return
    spec = dataset.element_spec
    x_spec = keras.utils.unpack_x_y_sample_weight(spec)[0] if isinstance(
        spec, (tuple, list)) else spec
    _check_dense(name, spec, model)
    specs, inputs = keras.tree.flatten(x_spec), _model_inputs(model)
    if not inputs or len(specs) != len(inputs):
        return
    if all(is_tensorflow(s, "TensorSpec") and s.shape.rank is not None
           and s.shape.rank == len(i.shape) - 1
           for s, i in zip(specs, inputs)):
        raise ValueError(
            f"Invalid `{name}`: received a tf.data.Dataset of single examples "
            f"(shape {_text(specs[0].shape)}); expected batches (shape "
            f"{_text(inputs[0].shape)}), as the model's input takes. Batch it: "
            f"{api('distributed_dataset', 'x, y, per_replica_batch_size')} "
            "batches at the global batch size, or call the dataset's batch() "
            "method.")


def check_data(model, method, x, y=None, sample_weight=None, name=None):
    """The checks of one set of data, before Keras sees it.

    Args:
        model: The model the data is for.
        method: As for `check_rows`.
        x, y, sample_weight: The data, as `fit` takes it.
        name: One name for all three in messages (`"validation_data"`), or
            None for their own names.
    """
    names = (name,) * 3 if name else ("x", "y", "sample_weight")
    check_rows(names[0], x, method)
    if is_dataset(x):
        check_batched(names[0], x, model)
        return
    _check_dense(names[0], x, model)
    _check_numeric_x(names[0], x, model)
    if y is not None:
        _check_dense(names[1], y, model)
        check_numeric_y(names[1], y)
        _check_labels(names[1], model, y)
    if sample_weight is not None:
        _check_sample_weight(names[2], model, sample_weight)


def _check_arguments(model, method, arguments):
    if "batch_size" in arguments:
        check_batch_size(arguments["batch_size"])
    x, y = arguments.get("x"), arguments.get("y")
    check_data(model, method, x, y, arguments.get("sample_weight"))
    if arguments.get("validation_data") is not None:
        check_data(model, "validation", *keras.utils.unpack_x_y_sample_weight(
            arguments["validation_data"]), name="validation_data")
    if method in ("fit", "train_on_batch"):
        _check_class_weight(model, arguments.get("class_weight"), x, y)


def _nothing_ran(method, result):
    """Whether `result` says no batch ran (Keras warns, at most)."""
    if method == "fit":
        history = getattr(result, "history", None)
        return bool(getattr(result, "epoch", None)) and isinstance(
            history, dict) and all(k.startswith("val_") for k in history)
    if method == "evaluate":
        return isinstance(result, (list, dict)) and not result
    return False


def checked_call(model, method, call, args, kwargs):
    """`call(*args, **kwargs)`, `model.<method>`, with its arguments checked.

    The hook of `TemplateBacked.fit`, `evaluate`, `predict`,
    `train_on_batch` and `test_on_batch`: refuses what the model's engine
    refuses first (`model.check_scope(method)`: on the TensorFlow engines,
    a call inside a strategy's scope that is not the model's) and bad data
    (`check_data`, `batch_size`, `class_weight`) before Keras runs; after
    it, a dataset of unknown size that yielded no batch (Keras returns an
    empty history, the mirrored engine raises `StopIteration`, `predict`
    `UnboundLocalError`).

    Args:
        model: A model of this package (a `TemplateBacked`).
        method: The name of the `keras.Model` method called.
        call: The method of the class after `TemplateBacked`, bound.
        args, kwargs: The call's arguments.

    Returns:
        What `call` returns.
    """
    arguments = _bound(method, model, args, kwargs)
    if arguments is None:
        return call(*args, **kwargs)
    validating = method == "evaluate" and internals.validates_for_fit(arguments)
    data = "validation_data" if validating else "x"
    for_what = "validation" if validating else method
    if not validating:
        model.check_scope(method)
        _check_arguments(model, method, arguments)
    try:
        result = call(*args, **kwargs)
    except StopIteration:
        if validating or _has_unknown_size(arguments.get("x")):
            raise no_batch_error(data, for_what) from None
        raise
    except UnboundLocalError as error:
        if method == "predict" and "batch_outputs" in str(error):
            raise no_batch_error("x", "predict") from None
        raise
    if method in _VERB and _nothing_ran(method, result):
        raise no_batch_error(data, for_what)
    return result
