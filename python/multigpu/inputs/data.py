"""The data's rows, shapes and types, checked before Keras sees them.

Data of no rows (`check_rows`), ragged tensors the engines cannot cut into
sub-batches (`check_dense`), strings where the model takes numbers
(`check_numeric_x`, `check_numeric_y`) and a dataset of single examples
where batches are expected (`check_batched`), each refused with the fix.
TensorFlow's values are recognised without importing TensorFlow
(`is_tensorflow`).
"""

import operator

import keras
import numpy as np

from multigpu.messages import api, current_language, literals
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


def shape_of(leaf):
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
    return {shape[0] for shape in map(shape_of, keras.tree.flatten(value))
            if shape and shape[0] is not None}


def has_unknown_size(value):
    """Whether `value` is data whose rows only iterating it shows."""
    return value is not None and not _row_counts(value)


def shape_text(shape):
    """A shape as messages write it.

    Example:
    >>> shape_text([32, 4])
    '(32, 4)'
    """
    return str(tuple(shape))


def values_text(values):
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


def check_dense(name, value, model):
    """Refuses a ragged tensor where the model's inputs are not ragged.

    Raises:
        ValueError: naming `name` and how to pad the rows to one length.
    """
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


def check_numeric_x(name, x, model):
    """Refuses strings where every input of the model takes numbers.

    Raises:
        ValueError: naming `name`, the dtypes and how to encode text.
    """
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
    check_dense(name, spec, model)
    specs, inputs = keras.tree.flatten(x_spec), _model_inputs(model)
    if not inputs or len(specs) != len(inputs):
        return
    if all(is_tensorflow(s, "TensorSpec") and s.shape.rank is not None
           and s.shape.rank == len(i.shape) - 1
           for s, i in zip(specs, inputs)):
        raise ValueError(
            f"Invalid `{name}`: received a tf.data.Dataset of single examples "
            f"(shape {shape_text(specs[0].shape)}); expected batches (shape "
            f"{shape_text(inputs[0].shape)}), as the model's input takes. Batch it: "
            f"{api('distributed_dataset', 'x, y, per_replica_batch_size')} "
            "batches at the global batch size, or call the dataset's batch() "
            "method.")
