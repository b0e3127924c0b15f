"""The TensorFlow engines' NaN/inf guard, inside their training step.

The engines' training step (`multigpu.step.train_step`) checks every
floating-point tensor of its share of the batch (`check`), and every write
of the step waits for the verdict, an assertion (`Record.asserted`); the
forward pass runs beside the check (`multigpu.step.stateless`). On a bad batch
each replica's bad share goes into the model's `Record` (`kept`) before
the assertion fails, and nothing is written (BatchNormalization's
statistics, Dropout's seed, the weights, the optimizer, the metrics). The
train function then raises a `multigpu.step.nonfinite.NonFiniteInputError`
from the record (its `Reporting` link, `multigpu.step.train_function`),
naming the epoch and batch (kept by a `nonfinite.Position` callback) and
the input. Under a strategy the replicas' updates wait for one verdict, so
no collective of the update starts on a bad batch.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from multigpu import tensorflow_internals
from multigpu.step.nonfinite import Findings, Position

# The guard's assertion's message, as TensorFlow logs it on a bad batch.
ASSERTION = ("multigpu: non-finite training data; the NonFiniteInputError "
             "raised next names the batch and the input")

def is_checked(tensor):
    """Whether the check reads `tensor` (a dense floating-point tensor)."""
    return (isinstance(tensor, tf.Tensor) and tensor.dtype.is_floating
            and not isinstance(tensor, (tf.SparseTensor, tf.RaggedTensor)))


def check(tensors):
    """Whether every tensor of a list is finite (traced).

    One `is_finite` and one reduction per tensor; the bad values are
    counted and placed only once a step has failed (`kept`).

    Args:
        tensors: Floating-point tensors (see `checked_leaves`).

    Returns:
        A boolean scalar tensor.

    Example:
    >>> finite = check([x, y])
    """
    if not tensors:
        return tf.constant(True)
    flags = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors]
    return flags[0] if len(flags) == 1 else tf.reduce_all(tf.stack(flags))


def kept(tensors):
    """A replica's checked tensors, packed into one float64 vector (traced).

    Traced only in the branch of a step that does not run, so that the
    error can count and place the bad values afterwards (`_counts`) at no
    cost to a good step. float64 holds every floating-point value of the
    narrower types exactly, NaN and inf included.

    Args:
        tensors: The tensors `check` read.

    Returns:
        A flat float64 tensor: the row count and the size of each tensor,
        then each tensor's values.
    """
    sizes = [tf.cast(tf.stack([tf.shape(t)[0] if t.shape.rank else 1,
                               tf.size(t)]), tf.float64) for t in tensors]
    values = [tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tensors]
    return tf.concat(sizes + values, 0)


def _counts(flat, tensors):
    """`kept`'s numbers as `[tensor] -> (nan, inf, bad rows)`."""
    shapes = flat[:2 * tensors].astype(np.int64).reshape(tensors, 2)
    at, out = 2 * tensors, []
    for rows, size in shapes:
        values = flat[at:at + size].reshape(rows, -1)
        at += size
        nan = np.isnan(values).sum(axis=1)
        inf = np.isinf(values).sum(axis=1)
        out.append((int(nan.sum()), int(inf.sum()),
                    np.flatnonzero(nan + inf)))
    return out


class Record:
    """What a model's guarded steps found, as data in variables.

    `found` has one copy per replica (synchronised on read): empty, or the
    layout's index and the `kept` share of a failed step. With several
    steps per call of the train function, `taken` counts the steps that
    passed the check, and `Reporting` notes it after each call
    (`note_call`), so that the error names the failed step of a call. The
    training step writes them (`noted` in each replica, then `asserted`);
    `found_error` reads them only after a call failed.

    Args:
        strategy: The model's distribution strategy (the variables are
            created in its scope).
    """

    def __init__(self, strategy):
        self.strategy = strategy
        with tf.init_scope(), strategy.scope():
            self.taken = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="nonfinite_taken")
            self.found = tf.Variable(
                tf.zeros([0], tf.float64), shape=tf.TensorShape(None),
                trainable=False, name="nonfinite_found",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.NONE)
        self.layouts = []
        # Whether the traced step counts (`steps_per_execution` > 1), and
        # `taken` when the train function's current call started (a
        # tensor, read only after a failure). Only counting steps change
        # `taken`, and `note_call` follows every call of one, so the value
        # noted after the last such call holds until the next.
        self.counting = False
        self.taken_before = 0

    def layout(self, leaves):
        """The index of a trace's list of `Leaf`s (recorded once per trace)."""
        leaves = [leaf for leaf, _ in leaves]
        if leaves not in self.layouts:
            self.layouts.append(leaves)
        return self.layouts.index(leaves)

    def noted(self, ok, tensors, layout):
        """`ok`, once a bad share is kept (traced, in a replica).

        Args:
            ok: A boolean scalar tensor, `check(tensors)`.
            tensors: The replica's checked tensors.
            layout: The index from `layout`.

        Returns:
            `ok`, after this replica's copy of `found` holds the share when
            `ok` is False.
        """

        def note():
            return tf.group(self.found.assign(tf.concat(
                [tf.constant([layout], tf.float64), kept(tensors)], 0)))

        def kept_if_bad():
            with tf.control_dependencies([note()]):
                return tf.identity(ok)

        noted = tf.cond(ok, lambda: tf.identity(ok), kept_if_bad)
        if tf.executing_eagerly():  # `run_eagerly=True`: no graph to shape
            return noted
        return tensorflow_internals.run_branch_as_function(noted)

    def asserted(self, oks, counting):
        """Asserts that every replica's share was finite (traced).

        Without a strategy, or in cross-replica context.

        Args:
            oks: The replicas' `noted` verdicts.
            counting: Whether to count the step (several steps per call).

        Returns:
            True once the assertion passed (and, when `counting`, `taken`
            counts this step).
        """
        self.counting = counting
        every = oks[0] if len(oks) == 1 else tf.reduce_all(tf.stack(oks))
        assertion = tf.debugging.Assert(every, [ASSERTION])
        with tf.control_dependencies([assertion]):
            if not counting:
                return tf.identity(every)
            counted = self.taken.assign_add(1, read_value=False)
        with tf.control_dependencies([counted]):
            return tf.identity(every)

    def note_call(self):
        """Notes `taken` after a call of the train function (counting steps).

        The next call's steps are counted from it: a failed call's offset
        is `taken` then minus this.
        """
        self.taken_before = self.taken.read_value()

    def found_error(self, position):
        """The failed step's `NonFiniteInputError`, or None if none failed.

        Called when the train function raised an error: the guard's
        assertion, or anything else (then this returns None).

        Args:
            position: The model's `Position` (the epoch and first batch of
                the call).

        Returns:
            A `NonFiniteInputError` naming the failed step, or None.
        """
        copies = self.strategy.experimental_local_results(self.found)
        shares = [copy.numpy() for copy in copies]
        if not any(share.size for share in shares):
            return None
        for copy in copies:
            copy.assign(tf.zeros([0], tf.float64))
        offset = 0
        if self.counting:
            # The failed step is not counted; the call's steps before it are.
            offset = int(self.taken.numpy()) - int(self.taken_before)
        leaves = self.layouts[int(next(s[0] for s in shares if s.size))]
        clean = [(0, 0, np.zeros([0], np.int64))] * len(leaves)
        counts = [_counts(share[1:], len(leaves)) if share.size else clean
                  for share in shares]
        return Findings(leaves, counts).error(position.at(offset))


@dataclasses.dataclass(frozen=True)
class Reporting:
    """The guard's link of a model's train function: a bad batch raises.

    Registered as the `"guard"` link (`multigpu.step.train_function`). The
    guard's assertion fails the call on a bad batch; its
    `InvalidArgumentError` becomes the `NonFiniteInputError` the record
    describes. Other errors pass through. Two `Reporting`s of the same
    record and position are equal, so registering one again changes
    nothing.

    Attributes:
        record: The model's `Record`, which its training step writes.
        position: The model's `Position` callback.

    Example:
    >>> train_function.link(model, "guard", Reporting(record, position))
    """

    record: Record
    position: Position

    def __call__(self, train_function):
        """`train_function`, raising `NonFiniteInputError` on a bad batch.

        Args:
            train_function: The train function below the link.

        Returns:
            A function of the same arguments.
        """
        record, position = self.record, self.position

        def train(*args, **kwargs):
            found = None
            try:
                return train_function(*args, **kwargs)
            except tf.errors.InvalidArgumentError:
                found = record.found_error(position)
                if found is None:
                    raise
            finally:
                if record.counting:
                    record.note_call()
            # Raised here, not in the `except` block: TensorFlow's error,
            # its context, would keep the frames of the failed call, and
            # with them the input iterator, alive as long as this error.
            raise found

        return train
