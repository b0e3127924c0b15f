"""Stops training on NaN or inf in a batch, naming the batch and the input.

A NaN or inf in the inputs, labels or sample weights of one batch turns the
weights into NaN in that step (the gradients are NaN), and Keras trains on:
the reported loss may even stay finite (metrics average over the epoch), and
hours later the model predicts NaN.

The engines' training step (`multigpu.training_step`) checks every
floating-point tensor of its share of the batch first (`check`) and updates
the weights only when every replica's share was finite. On a bad batch the
labels and sample weights (and the inputs of a model that `reads_indices`)
go in as zeros (`sanitized`: a NaN cast to an index would otherwise fail in
a gather), what the forward pass wrote is put back (BatchNormalization's
statistics, Dropout's seed), and the findings, NaN and inf counts per row
(`located`), go into the model's `Record`. The train function then raises
a `NonFiniteInputError` from them (`reporting`), naming the epoch and batch
(kept by a `Position` callback), the input (`x`, `y` or `sample_weight`,
and which named input or output), how many NaN and inf values it had and
in which rows. Every collective of the step completes, bad batch or not.

Turn the check off per model with `model.check_finite = False` (in R,
`model$check_finite <- FALSE`). Its cost per step is measured by
`python -m bench.guard_cost` (docs/benchmarks.md).
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from multigpu import internals
from multigpu.arguments import check_flag
from multigpu.messages import current_language, literal

# The key of the guarded step's logs that carries `Record.status()` to the
# train function's caller (`reporting` takes it out).
STATUS = "_multigpu_nonfinite_status"
# Rows of a tensor the error names; the counts cover them all.
_FIRST_ROWS = 5


class NonFiniteInputError(ValueError):
    """A training batch holds NaN or inf values.

    A `ValueError` (in R, a `multigpu_value_error`): the data is the bad
    input. `epoch` and `step` (0-based, as Keras's callbacks count; None
    outside `fit`) and `inputs` (the labels of the offending tensors, e.g.
    `x['image']`) say where.
    """

    def __init__(self, message, epoch=None, step=None, inputs=()):
        super().__init__(message)
        self.epoch = epoch
        self.step = step
        self.inputs = list(inputs)


def check_finite_flag(value):
    """`value` for `model.check_finite`, checked (True or False)."""
    return check_flag("check_finite", value)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """Where a checked tensor sits in the batch.

    Attributes:
        kind: `"x"`, `"y"` or `"sample_weight"`.
        key: The dict key, or the model's input (output) name for a list
            that matches them; `""` otherwise.
        position: The list index, or -1.
    """

    kind: str
    key: str
    position: int


def _leaves(structure, kind, names):
    """`[(Leaf, tensor)]` for the tensors of x, y or the sample weights."""
    if structure is None:
        return []
    if isinstance(structure, dict):
        return [(Leaf(kind, str(key), -1), tensor)
                for key, part in structure.items()
                for tensor in keras.tree.flatten(part)]
    if isinstance(structure, (list, tuple)):
        out = []
        for i, part in enumerate(structure):
            key = names[i] if names and len(names) == len(structure) else ""
            out += [(Leaf(kind, key, i), t) for t in keras.tree.flatten(part)]
        return out
    return [(Leaf(kind, "", -1), t) for t in keras.tree.flatten(structure)]


def is_checked(tensor):
    """Whether the check reads `tensor` (a dense floating-point tensor)."""
    return (isinstance(tensor, tf.Tensor) and tensor.dtype.is_floating
            and not isinstance(tensor, (tf.SparseTensor, tf.RaggedTensor)))


def checked_leaves(x, y, sample_weight, input_names=(), output_names=()):
    """The floating-point tensors of a batch that the check reads.

    Args:
        x, y, sample_weight: The parts of the batch, each a tensor or a
            list/dict of them (or None).
        input_names: The model's input names, to name the tensors of a list
            `x`.
        output_names: The model's output names, for lists `y` and
            `sample_weight`.

    Returns:
        A list of `(Leaf, tensor)`.

    Example:
    >>> [leaf.kind for leaf, _ in checked_leaves(x, y, None)]
    ['x', 'y']
    """
    leaves = (_leaves(x, "x", list(input_names))
              + _leaves(y, "y", list(output_names))
              + _leaves(sample_weight, "sample_weight", list(output_names)))
    return [(leaf, t) for leaf, t in leaves if is_checked(t)]


def _per_row(tensor):
    """`tensor`'s NaN and inf counts per row (one row for a scalar)."""
    rows = tf.reshape(tensor, [tf.shape(tensor)[0], -1] if tensor.shape.rank
                      else [1, 1])
    return [tf.reduce_sum(tf.cast(test(rows), tf.int64), axis=1)
            for test in (tf.math.is_nan, tf.math.is_inf)]


def check(tensors):
    """Whether every tensor of a list is finite (traced).

    One `is_finite` and one reduction per tensor; `located` counts and
    places the bad values, only once a step has failed.

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


def located(shares):
    """The NaN and inf counts per row of each replica's checked tensors.

    Traced, only in the branch of a step that did not run: what the error
    says (counts, rows) is worked out from these numbers afterwards.

    Args:
        shares: Per replica, the tensors `check` read.

    Returns:
        A flat int64 tensor: the replica count, the row count of each
        tensor of each replica, then per tensor its NaN counts per row and
        its inf counts per row.
    """
    per_row = [_per_row(t) for share in shares for t in share]
    lengths = (tf.stack([tf.size(nan, tf.int64) for nan, _ in per_row])
               if per_row else tf.zeros([0], tf.int64))
    return tf.concat(
        [tf.constant([len(shares)], tf.int64), lengths]
        + [part for pair in per_row for part in pair], 0)


def _counts(flat, tensors):
    """`located`'s numbers as `[replicas][tensor] -> (nan, inf, bad rows)`."""
    replicas = int(flat[0])
    lengths = flat[1:1 + replicas * tensors]
    at = 1 + replicas * tensors
    out = []
    for replica in range(replicas):
        share = []
        for i in range(tensors):
            rows = int(lengths[replica * tensors + i])
            nan, inf = flat[at:at + rows], flat[at + rows:at + 2 * rows]
            at += 2 * rows
            share.append((int(nan.sum()), int(inf.sum()),
                          np.flatnonzero(nan + inf)))
        out.append(share)
    return out


def sanitized(tensor, finite):
    """`tensor` where `finite`, else zeros in its place (traced).

    A bad batch still runs its forward and backward pass (every replica
    takes part in every collective). Labels, sample weights and the inputs
    of a model that `reads_indices` go in as zeros then, so that a NaN a
    gather or a sparse loss would read as an index does not fail the pass
    with an error of its own. Nothing the pass computes is applied.
    """
    return tf.where(finite, tensor, tf.zeros([], tensor.dtype))


# Layers that read their inputs as indices: a NaN cast to an integer is an
# index out of range, which the layer's kernel reports as an error of its
# own.
INDEX_LAYERS = (
    keras.layers.Embedding, keras.layers.IntegerLookup,
    keras.layers.StringLookup, keras.layers.CategoryEncoding,
    keras.layers.Hashing, keras.layers.TextVectorization,
)


def reads_indices(model):
    """Whether `model` may turn a NaN of its inputs into an index.

    True for a model with an integer input or a layer of `INDEX_LAYERS`:
    its inputs are `sanitized` on a bad batch.

    Args:
        model: A Keras model.

    Returns:
        True or False.
    """
    if any(str(t.dtype).startswith(("int", "uint"))
           for t in keras.tree.flatten(model.inputs or [])):
        return True
    return any(isinstance(layer, INDEX_LAYERS)
               for layer in internals.nested_layers(model))


class Record:
    """What a model's guarded steps found, as data in variables.

    `taken` counts the steps; `failed_at` is the first step that did not
    run, or -1; `found` holds that step's `located` numbers behind its
    layout's index. The training step writes them, and returns `taken` and
    `failed_at` in its logs (`STATUS`); `raise_if_found` reads `found` only
    after a failure.

    Args:
        strategy: The model's distribution strategy (the variables are
            created in its scope: mirrored, written in cross-replica
            context).
    """

    def __init__(self, strategy):
        with tf.init_scope(), strategy.scope():
            self.taken = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="nonfinite_taken")
            self.failed_at = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                         name="nonfinite_failed_at")
            self.found = tf.Variable(tf.zeros([0], tf.int64),
                                     shape=tf.TensorShape(None),
                                     trainable=False, name="nonfinite_found")
        self.layouts = []
        self._steps_before = 0

    def layout(self, leaves):
        """The index of a trace's list of `Leaf`s (recorded once per trace)."""
        leaves = [leaf for leaf, _ in leaves]
        if leaves not in self.layouts:
            self.layouts.append(leaves)
        return self.layouts.index(leaves)

    def failed(self):
        """Whether a step of this call failed already (traced)."""
        return self.failed_at >= 0

    def count(self):
        """Counts a step that ran (traced; the gate's update branch)."""
        return tf.group(self.taken.assign_add(1))

    def note(self, found, layout):
        """Counts a step that did not run; writes the first one's findings.

        Traced, in the gate's other branch: the batch was not finite, or a
        step of this call failed before (then only counted).

        Args:
            found: `located`'s numbers.
            layout: The index from `layout`.

        Returns:
            The op.
        """

        def first():
            with tf.control_dependencies([
                    self.found.assign(tf.concat([[layout], found], 0)),
                    self.failed_at.assign(self.taken)]):
                return self.count()

        return tf.cond(self.failed(), self.count, first)

    def status(self):
        """`[taken, failed_at]`, read after the step (traced)."""
        return tf.stack([self.taken.read_value(), self.failed_at.read_value()])

    def raise_if_found(self, status, position):
        """Raises the failed step's `NonFiniteInputError`, if one failed.

        Args:
            status: `status()` as the call's last step returned it.
            position: The model's `Position` (the epoch and first batch of
                the call).

        Raises:
            NonFiniteInputError: naming the failed step.
        """
        taken, failed_at = (int(v) for v in status)
        before, self._steps_before = self._steps_before, taken
        if failed_at < 0:
            return
        flat = self.found.numpy()
        self.found.assign(tf.zeros([0], tf.int64))
        self.failed_at.assign(-1)
        leaves = self.layouts[int(flat[0])]
        counts = _counts(flat[1:], len(leaves))
        raise Findings(leaves, counts).error(position.at(failed_at - before))


@dataclasses.dataclass
class Findings:
    """What a step's check found, as numbers, for `NonFiniteInputError`.

    Attributes:
        leaves: The checked tensors' `Leaf`s.
        counts: Per replica, per leaf, `(NaN count, inf count, bad rows)`.
    """

    leaves: list
    counts: list

    def error(self, position=None):
        """The `NonFiniteInputError` these findings make.

        Args:
            position: `(epoch, batch)` of `fit`, 0-based, or None.

        Returns:
            A `NonFiniteInputError`.
        """
        replicas = len(self.counts)
        parts, labels = [], []
        for replica, per_leaf in enumerate(self.counts):
            for leaf, (nan, inf, rows) in zip(self.leaves, per_leaf):
                if nan + inf == 0:
                    continue
                label = _label(leaf)
                if label not in labels:
                    labels.append(label)
                shown = [str(r) for r in rows[:_FIRST_ROWS]]
                parts.append(f"{label} has {_values(nan, inf)} in "
                             f"{_rows(len(rows), shown, replica, replicas)}")
        if position is None:
            where, epoch, step = "a training batch", None, None
        else:
            epoch, step = position
            where = f"epoch {epoch + 1}, batch {step + 1} (counted from 1)"
        off = ("model$check_finite <- FALSE" if current_language() == "r"
               else "model.check_finite = False")
        message = (
            f"Non-finite training data in {where}: {'; '.join(parts)}. "
            "Training stopped before this batch changed the weights: a NaN "
            "or inf would have turned them into NaN. Remove or replace those "
            "rows (e.g. impute missing values) and train again; to train "
            f"without this check, set {off}."
        )
        return NonFiniteInputError(message, epoch=epoch, step=step,
                                   inputs=labels)


def _label(leaf):
    """`x['image']` / `x$image`, `y[1]` / `y[[2]]`, `sample_weight`."""
    kind, key, position = leaf.kind, leaf.key, leaf.position
    r = current_language() == "r"
    if position >= 0:
        label = f"{kind}[[{position + 1}]]" if r else f"{kind}[{position}]"
        return f"{label} ({literal(key)})" if key else label
    if key:
        return f"{kind}${key}" if r and key.isidentifier() else (
            f"{kind}[[{literal(key)}]]" if r else f"{kind}[{literal(key)}]")
    return kind


def _values(nan, inf):
    counts = [f"{n} {name}" for n, name in ((nan, "NaN"), (inf, "inf")) if n]
    return " and ".join(counts) + (" value" if nan + inf == 1 else " values")


def _rows(count, first, replica, replicas):
    """`1 row (row 4 of the batch, counted from 0)` and the like."""
    shown = ", ".join(first) + (", ..." if count > len(first) else "")
    of = ("the batch" if replicas == 1 else
          f"replica {replica + 1} of {replicas}'s share of the batch")
    noun = "row" if count == 1 else "rows"
    return f"{count} {noun} ({noun} {shown} of {of}, counted from 0)"


class Position(keras.callbacks.Callback):
    """The epoch and first batch of the train function's call in `fit`.

    `fit` calls `on_train_batch_begin` with the first batch of each call of
    the train function (`steps_per_execution` batches); the `Record` counts
    the batches of a call from it. None outside `fit`.
    """

    def __init__(self):
        super().__init__()
        self.epoch = None
        self.batch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.batch = batch

    def on_train_end(self, logs=None):
        self.clear()

    def clear(self):
        """Forgets the position: the next step is outside `fit`."""
        self.epoch = self.batch = None

    def at(self, offset):
        """`(epoch, batch + offset)`, or None outside `fit`."""
        if self.epoch is None or self.batch is None:
            return None
        return self.epoch, self.batch + offset


def reporting(train_function, record, position):
    """Wraps a train function: a bad batch raises `NonFiniteInputError`.

    Args:
        train_function: The model's `train_function`.
        record: The model's `Record`, which its training step writes.
        position: The model's `Position` callback.

    Returns:
        A function of the same arguments.
    """

    def train(*args, **kwargs):
        logs = dict(train_function(*args, **kwargs))
        record.raise_if_found(logs.pop(STATUS).numpy(), position)
        return logs

    train.reports_nonfinite = True
    return train
