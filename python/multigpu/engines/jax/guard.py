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

from multigpu import inputs, internals
from multigpu.engines.functional import layer_name
from multigpu.engines.template import compile_like_template, with_callbacks
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


class HostGuarded:
    """The guard as the JAX models carry it: `check_finite`, the checked batches, `fit`.

    Mixed into `ShardedModel` (`multi_gpu_model`) and `ShardedWeightsModel`
    (`model_parallel`): each hands `_checked` to the train function it
    makes, and trains through `guarded_fit`.
    """

    _check_finite = True

    @property
    def check_finite(self):
        """Whether `fit` stops on a batch with NaN or inf (True by default).

        Each training batch is checked on the host before its step
        (`multigpu.engines.jax.guard`); a bad one raises
        `NonFiniteInputError` before it changes anything. Set it to False
        (in R, `model$check_finite <- FALSE`) to train without the check.
        """
        return self._check_finite

    @check_finite.setter
    def check_finite(self, value):
        self._check_finite = nonfinite.check_finite_flag(value)

    def _position(self):
        """The `nonfinite.Position` callback every `fit` gets, made once."""
        return internals.untracked(self, "_fit_position",
                                   make=nonfinite.Position)

    def _checked(self, state, iterator):
        """The batches of one call of the train function, checked if on.

        A bad batch leaves `state`, the state before the call, to be put
        back into the variables when `fit` ends.
        """
        if not self.check_finite:
            return iterator
        try:
            return checked_batches(
                iterator, max(int(self.steps_per_execution or 1), 1),
                self._position(), [layer_name(t) for t in self.inputs],
                list(self.output_names))
        except nonfinite.NonFiniteInputError:
            internals.hold_jax_state(self, state)
            raise

    def guarded_fit(self, args, kwargs):
        """`keras.Model.fit` with the guard's position callback and the data checks.

        Args:
            args, kwargs: What `fit` was called with.

        Returns:
            The `History` of `keras.Model.fit`.
        """
        compile_like_template(self)
        position = self._position()
        args, kwargs = with_callbacks(self, args, kwargs, [position])
        try:
            return inputs.checked_call(
                self, "fit", lambda *a, **k: keras.Model.fit(self, *a, **k),
                args, kwargs)
        finally:
            # A failed `fit` ends without `on_train_end`.
            position.clear()
