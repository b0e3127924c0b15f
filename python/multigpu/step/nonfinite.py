"""Stops training on NaN or inf in a batch, naming the batch and the input.

A NaN or inf in the inputs, labels or sample weights of one batch turns the
weights into NaN in that step (the gradients are NaN), and Keras trains on:
the reported loss may even stay finite (metrics average over the epoch), and
hours later the model predicts NaN.

What every engine's guard shares, on every backend: the error,
`NonFiniteInputError`, naming the epoch and batch (kept by a `Position`
callback), the input (`x`, `y` or `sample_weight`, and which named input
or output), how many NaN and inf values it had and in which rows
(`Findings`, counted in NumPy); the tensors a batch is checked in
(`checked_leaves`); and `model.check_finite`'s value. Where the check runs
is the engine's: inside the TensorFlow engines' step
(`multigpu.step.guard`), on the host before each batch is placed on the
JAX engine (`multigpu.engines.jax.guard`). This module imports no
TensorFlow.

Turn the check off per model with `model.check_finite = False` (in R,
`model$check_finite <- FALSE`). Its cost per step is measured by
`python -m bench.guard_cost` (docs/benchmarks.md).
"""

import dataclasses

import keras

from multigpu.arguments import check_flag
from multigpu.messages import current_language, literal

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


def checked_leaves(x, y, sample_weight, keep, input_names=(),
                   output_names=()):
    """The floating-point tensors of a batch that the check reads.

    Args:
        x, y, sample_weight: The parts of the batch, each a tensor or a
            list/dict of them (or None).
        keep: Which leaves are checked: a function of a leaf's tensor
            (`multigpu.step.guard.is_checked` for TensorFlow's dense
            floating-point tensors; the JAX engine's for arrays).
        input_names: The model's input names, to name the tensors of a list
            `x`.
        output_names: The model's output names, for lists `y` and
            `sample_weight`.

    Returns:
        A list of `(Leaf, tensor)`.

    Example:
    >>> [leaf.kind for leaf, _ in checked_leaves(x, y, None, keep=is_checked)]
    ['x', 'y']
    """
    leaves = (_leaves(x, "x", list(input_names))
              + _leaves(y, "y", list(output_names))
              + _leaves(sample_weight, "sample_weight", list(output_names)))
    return [(leaf, t) for leaf, t in leaves if keep(t)]


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


