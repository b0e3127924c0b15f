"""The JAX engine's NaN/inf guard: each batch checked before it is placed.

Keras's JAX trainer hands the train function NumPy batches (from arrays, a
`PyDataset`, a generator or a `tf.data` pipeline it converts). The guard
checks every floating-point array of each batch on the host before the
batch is put on the devices, while the devices still run the previous
step (JAX dispatches steps without waiting for them), so no compiled step
changes and nothing waits. A bad batch never reaches the step: the train
function raises `NonFiniteInputError` (`multigpu.step.nonfinite`), naming
the epoch and batch, the input, and how many NaN and inf values it had in
which rows, and `fit` ends with the weights, optimizer and metrics of the
step before it.
"""

import itertools

import keras
import numpy as np

from multigpu.step import nonfinite


def is_float_array(value):
    """Whether the guard reads `value`: an array of a floating-point dtype.

    Example:
    >>> is_float_array(np.zeros(3, "float16")), is_float_array(np.arange(3))
    (True, False)
    """
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return False
    name = keras.backend.standardize_dtype(dtype)
    return name.startswith(("float", "bfloat"))


def _host_values(array):
    """`array` as a NumPy array NumPy's `isfinite` takes (bfloat16 widened)."""
    values = np.asarray(array)
    return values if values.dtype.kind == "f" else values.astype(np.float32)


def _counts(array):
    """`(NaN count, inf count, bad rows)` of one array."""
    values = _host_values(array)
    nan, inf = np.isnan(values), np.isinf(values)
    bad = (nan | inf).reshape(len(values), -1).any(axis=1) if values.ndim else (
        np.array([nan or inf]))
    return int(nan.sum()), int(inf.sum()), np.flatnonzero(bad)


def findings(batch, input_names=(), output_names=()):
    """What the check finds in one batch: `nonfinite.Findings`, or None.

    Args:
        batch: `(x, y, sample_weight)` as Keras's trainer gives it (or `x`
            alone, or `(x, y)`).
        input_names, output_names: The model's, to name list inputs.

    Returns:
        None when every floating-point array is finite.

    Example:
    >>> findings((np.array([[1.0, np.nan]]), np.zeros((1, 1))))
    Findings(leaves=[...], counts=[...])
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    leaves = nonfinite.checked_leaves(x, y, sample_weight, is_float_array,
                                      input_names, output_names)
    if all(np.isfinite(_host_values(array)).all() for _, array in leaves):
        return None
    return nonfinite.Findings([leaf for leaf, _ in leaves],
                              [[_counts(array) for _, array in leaves]])


def checked_batches(iterator, steps, position, input_names=(), output_names=()):
    """The next call's batches from `iterator`, each checked.

    Draws the `steps` batches one call of the train function trains on
    (`steps_per_execution`) before any is trained, so that a bad one stops
    the call before its first step.

    Args:
        iterator: The batches Keras's trainer gives the train function.
        steps: Batches per call.
        position: The model's `nonfinite.Position` callback.
        input_names, output_names: The model's.

    Returns:
        An iterator over the checked batches.

    Raises:
        NonFiniteInputError: for the first batch holding NaN or inf.
    """
    batches = list(itertools.islice(iterator, steps))
    for offset, batch in enumerate(batches):
        found = findings(batch, input_names, output_names)
        if found is not None:
            raise found.error(position.at(offset))
    return iter(batches)
