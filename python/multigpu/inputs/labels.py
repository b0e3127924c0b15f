"""The targets, sample weights and class weights, checked against the model.

Labels outside the classes a sparse loss takes, or not whole numbers
(`check_labels`); R's missing values among the targets (`check_no_r_na`);
sample weights of another shape than one per row (`check_sample_weight`);
class weights with keys that are not classes, or classes without a
weight (`check_class_weight`).
"""

import numbers

import keras
import numpy as np

from multigpu.arguments import is_int
from multigpu.inputs.data import (
    is_dataset,
    is_tensorflow,
    shape_of,
    shape_text,
    values_text,
)
from multigpu.messages import R_NA_INTEGER, current_language, literal, literals


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


def check_labels(name, model, y):
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
            f"{values_text(fractional)}. Map each class to an integer index "
            "from 0 first.")
    wrong = considered & ((by_row < 0) | (by_row >= classes))
    if wrong.any():
        bad_rows = int(wrong.any(axis=1).sum())
        raise ValueError(
            f"Invalid `{name}`: {what}; received {values_text(np.unique(by_row[wrong]))} "
            f"(in {bad_rows} of {rows} rows). Count the classes from 0 "
            "(labels counted from 1 need 1 subtracted), or give the output "
            "one unit per class.")


def check_sample_weight(name, model, sample_weight):
    """Weights of one output: one per row, or one per row and time step."""
    shape = shape_of(sample_weight) if isinstance(sample_weight, np.ndarray) or (
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
    expected = f"one weight per row, shape {shape_text((shape[0],))}"
    if per_row:
        expected += (", or one per row and step, shape "
                     f"{shape_text((shape[0],) + per_row)}")
    raise ValueError(
        f"Invalid `{name}`: received an array of shape {shape_text(shape)}; "
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


def check_class_weight(model, class_weight, x, y):
    """Refuses class weights Keras would ignore or misread.

    Keys that are not class indices, weights that are not numbers >= 0,
    classes the model's output does not have, and classes without a
    weight: those `y` holds, or with a dataset `x` every class of the
    output.

    Args:
        model: The model trained.
        class_weight: The `class_weight` argument of `fit`, or None.
        x: The inputs (a `tf.data.Dataset` holds the targets too).
        y: The targets, or None.

    Raises:
        ValueError: naming what is wrong and the fix.
    """
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
            f"{values_text(unknown)}, but output {literal(names[0])} has "
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
            f"{values_text(missing)}{where}; give every class a weight (1 "
            f"leaves a class as it is), e.g. {example}.")
