"""Stops training on NaN or inf in a batch, naming the batch and the input.

A NaN or inf in the inputs, labels or sample weights of one batch turns the
weights into NaN in that step (the gradients are NaN), and Keras trains on:
the reported loss may even stay finite (metrics average over the epoch), and
hours later the model predicts NaN. The engines' training step checks every
floating-point tensor of the batch before it changes anything and, when one has
a non-finite value, stops training with a `NonFiniteInputError` that names
the epoch and batch, the input (`x`, `y` or `sample_weight`, and which named
input or output), how many NaN and inf values it had and in which rows. The
weights keep their values of the step before.

The check is one pass over the batch (`is_finite` and a reduction per
tensor) and a `tf.cond` whose failing branch alone builds the report. It
runs beside the forward pass; what writes state waits for it
(`checked_step`). Its cost per step is measured by `python -m
bench.guard_cost` (docs/benchmarks.md). Turn it off per model with
`model.check_finite = False` (in R, `model$check_finite <- FALSE`).
"""

import contextlib
import inspect
import re
import threading
import types
import urllib.parse

import keras
import tensorflow as tf

from multigpu import internals
from multigpu.arguments import check_flag
from multigpu.messages import current_language, literal

_BEGIN = "<<multigpu-nonfinite"
_END = "nonfinite-multigpu>>"
_RECORD = re.compile(
    r"kind=(\w+);key=([^;]*);pos=(-?\d+);nan=(\d+);inf=(\d+);rows=(\d+);"
    r"first=\[([\d ]*)\];replica=(\d+)/(\d+)"
)
_FIRST_ROWS = 5
_KINDS = ("x", "y", "sample_weight")


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


def _leaves(structure, kind, names):
    """`[(kind, key, position, tensor)]` for the tensors of x, y or weights.

    `key` is the dict key or, for a list matching the model's named inputs
    (outputs for y and weights), that name; `position` the list index.
    """
    if structure is None:
        return []
    if isinstance(structure, dict):
        return [(kind, str(key), -1, tensor)
                for key, part in structure.items()
                for tensor in keras.tree.flatten(part)]
    if isinstance(structure, (list, tuple)):
        out = []
        for i, part in enumerate(structure):
            key = names[i] if names and len(names) == len(structure) else ""
            out += [(kind, key, i, t) for t in keras.tree.flatten(part)]
        return out
    return [(kind, "", -1, t) for t in keras.tree.flatten(structure)]


def _checked_tensor(tensor):
    return (isinstance(tensor, tf.Tensor) and tensor.dtype.is_floating
            and not isinstance(tensor, (tf.SparseTensor, tf.RaggedTensor)))


def _replica():
    """(this replica's index, replicas) under a strategy; (0, 1) otherwise."""
    context = tf.distribute.get_replica_context()
    count = getattr(context, "num_replicas_in_sync", 1)
    if context is None or count == 1:
        return tf.constant(0), 1
    return tf.cast(context.replica_id_in_sync_group, tf.int32), count


def _report(kind, key, position, tensor):
    """The failing branch's record for one tensor (a string tensor)."""
    replica, replicas = _replica()
    bad = tf.logical_not(tf.math.is_finite(tensor))
    nan = tf.reduce_sum(tf.cast(tf.math.is_nan(tensor), tf.int64))
    inf = tf.reduce_sum(tf.cast(tf.math.is_inf(tensor), tf.int64))
    if tensor.shape.rank == 0:
        bad_rows = tf.reshape(tf.where(bad), [-1])
    else:
        per_row = tf.reshape(bad, [tf.shape(tensor)[0], -1])
        bad_rows = tf.reshape(tf.where(tf.reduce_any(per_row, axis=1)), [-1])
    return tf.strings.format(
        "kind=" + kind + ";key=" + urllib.parse.quote(key, safe="")
        + f";pos={position};nan={{}};inf={{}};rows={{}};first={{}}"
        + f";replica={{}}/{replicas}",
        (nan, inf, tf.size(bad_rows), bad_rows[:_FIRST_ROWS], replica),
        summarize=-1,
    )


def check(data, input_names=(), output_names=()):
    """The check of a batch `data` for NaN and inf, traced.

    Call it inside the traced training step. The returned tensor exists
    only once every floating-point tensor of the batch is found finite;
    when one is not, computing it fails with an error that `explain_error`
    turns into a `NonFiniteInputError`. Ops that must not run on a bad
    batch take it as a control dependency.

    Args:
        data: A batch as `train_step` receives it: `x`, `(x, y)` or
            `(x, y, sample_weight)`, each a tensor or a list/dict of them.
        input_names: The model's input names, to name the tensors of a list
            `x`.
        output_names: The model's output names, for lists `y` and
            `sample_weight`.

    Returns:
        A boolean scalar tensor (True), or None when the batch holds no
        floating-point tensor to check.

    Example:
    >>> verdict = finite.check((x, y))
    >>> with tf.control_dependencies([verdict]):
    ...     update = variable.assign_add(1)
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    leaves = (_leaves(x, "x", list(input_names))
              + _leaves(y, "y", list(output_names))
              + _leaves(sample_weight, "sample_weight", list(output_names)))
    leaves = [leaf for leaf in leaves if _checked_tensor(leaf[3])]
    if not leaves:
        return None
    flags = [tf.reduce_all(tf.math.is_finite(leaf[3])) for leaf in leaves]
    finite = flags[0] if len(flags) == 1 else tf.reduce_all(tf.stack(flags))

    def fail():
        records = [_report(*leaf) for leaf in leaves]
        report = tf.strings.reduce_join(
            tf.boolean_mask(tf.stack(records),
                            tf.logical_not(tf.stack(flags))),
            separator="|")
        failed = tf.debugging.Assert(
            False, [tf.strings.join([_BEGIN, report, _END])])
        with tf.control_dependencies([failed]):
            return tf.constant(False)

    return _of_every_replica(
        tf.cond(finite, lambda: tf.constant(True), fail))


def _of_every_replica(verdict):
    """`verdict` of every replica's share of the batch, under a strategy.

    Each replica checks its own share; one whose share is bad must stop the
    others too, or their forward pass writes state (BatchNormalization's
    statistics, Dropout's seed) on the failing step. Every replica gets one
    tensor that waits for all their verdicts: the failing replica's report
    is the error. A graph edge per replica, no collective.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return verdict

    def combined(strategy, verdicts):
        return tf.reduce_all(tf.stack(
            strategy.experimental_local_results(verdicts)))

    return context.merge_call(combined, args=(verdict,))


# Layers that read their inputs as indices: a NaN cast to an integer is an
# index out of range, which the layer's kernel reports as an error of its
# own before the check's, unless the forward pass waits for the check.
INDEX_LAYERS = (
    keras.layers.Embedding, keras.layers.IntegerLookup,
    keras.layers.StringLookup, keras.layers.CategoryEncoding,
    keras.layers.Hashing, keras.layers.TextVectorization,
)


def reads_indices(model):
    """Whether `model` may turn a NaN of its inputs into an index.

    True for a model with an integer input or a layer of `INDEX_LAYERS`:
    its forward pass waits for the finite check.

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


def checked_step(step, data, model, input_names=(), output_names=()):
    """`step(data)`, a training step, changing no state on a bad batch.

    The check (`check`) runs beside the forward pass. What writes state
    waits for it: the labels and sample weights (so the loss and the
    metrics), the writes of the model's non-trainable variables
    (BatchNormalization's moving statistics, Dropout's seed) and the
    optimizer's update, its iteration count included. The whole step waits
    for it in a model that `reads_indices`.

    Args:
        step: Keras's `train_step` (or an engine's), of `data`.
        data: The batch.
        model: The model `step` trains.
        input_names: The model's input names (see `check`).
        output_names: The model's output names.

    Returns:
        What `step(data)` returns.

    Example:
    >>> def train_step(self, data):
    ...     return finite.checked_step(super().train_step, data, self)
    """
    verdict = check(data, input_names, output_names)
    if verdict is None:
        return step(data)
    if reads_indices(model):
        with tf.control_dependencies([verdict]):
            return step(data)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y, sample_weight = keras.tree.map_structure(
        lambda t: _after(verdict, t), (y, sample_weight))
    with _writes_after(model, verdict):
        return step(keras.utils.pack_x_y_sample_weight(x, y, sample_weight))


def _after(verdict, value):
    """`value`, a tensor once `verdict` exists; anything else as it is."""
    if not isinstance(value, tf.Tensor) or isinstance(
            value, (tf.SparseTensor, tf.RaggedTensor)):
        return value
    with tf.control_dependencies([verdict]):
        return tf.identity(value)


# The verdicts that the writes traced in a step wait for, per thread:
# `tf.distribute.MirroredStrategy` traces each replica's step in a thread of
# its own and runs the update's cross-replica part with the control
# dependencies every replica's thread had (`merge_call`).
_gates = threading.local()


def _pending_verdicts():
    return getattr(_gates, "verdicts", None) or []


def _gated_apply(optimizer, *args, **kwargs):
    with tf.control_dependencies(_pending_verdicts()[-1:]):
        return type(optimizer).apply(optimizer, *args, **kwargs)


def _gated_write(variable, value):
    with tf.control_dependencies(_pending_verdicts()[-1:]):
        return internals.direct_assign(variable, value)


@contextlib.contextmanager
def _writes_after(model, verdict):
    """A block whose writes of state wait for `verdict`.

    Keras's `train_step` updates the weights with
    `self.optimizer.apply_gradients`, which calls `apply`: everything the
    update writes, the iteration count included, is created there. The
    forward pass writes the model's non-trainable variables, through
    Keras's variables. Both get (once) a version that waits for the
    block's verdict while one is pending in this thread; outside such a
    block they are the classes'.
    """
    optimizer = model.optimizer
    if optimizer is not None and vars(optimizer).get("apply") is None:
        # A bound method: `copy.deepcopy` of the optimizer binds the copy.
        object.__setattr__(optimizer, "apply",
                           types.MethodType(_gated_apply, optimizer))
    for variable in model.non_trainable_variables:
        internals.wrap_variable_writes(variable, _gated_write)
    verdicts = _gates.__dict__.setdefault("verdicts", [])
    verdicts.append(verdict)
    try:
        yield
    finally:
        verdicts.pop()


def _label(kind, key, position):
    """`x['image']` / `x$image`, `y[1]` / `y[[2]]`, `sample_weight`."""
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


def _fit_position(model):
    """(epoch, first batch, last batch) of the running `fit`, 0-based.

    Read from Keras's `fit` loop (its `epoch`, `begin_step` and `end_step`),
    only after a failure; None outside `fit` (e.g. `train_on_batch`).
    """
    frame = inspect.currentframe()
    while frame is not None:
        local = frame.f_locals
        if local.get("self") is model and "epoch" in local and (
                "begin_step" in local):
            return (local["epoch"], local["begin_step"],
                    local.get("end_step", local["begin_step"]))
        frame = frame.f_back
    return None


def explain_error(error, model=None):
    """A `NonFiniteInputError` for an error raised by `guard`'s check.

    Args:
        error: An exception raised by a training step.
        model: The model trained, to read the epoch and batch of its `fit`.

    Returns:
        A `NonFiniteInputError`, or None if `error` is another error.
    """
    text = str(getattr(error, "message", None) or error)
    start, end = text.find(_BEGIN), text.find(_END)
    if not isinstance(error, tf.errors.InvalidArgumentError) or (
            start < 0 or end < start):
        return None
    records = _RECORD.findall(text[start + len(_BEGIN):end])
    parts, labels = [], []
    for kind, key, pos, nan, inf, rows, first, replica, replicas in records:
        label = _label(kind, urllib.parse.unquote(key), int(pos))
        labels.append(label)
        parts.append(f"{label} has {_values(int(nan), int(inf))} in "
                     f"{_rows(int(rows), first.split(), int(replica), int(replicas))}")
    position = _fit_position(model) if model is not None else None
    if position is None:
        where = "a training batch"
        epoch = step = None
    else:
        epoch, step, last = position
        batches = (f"batch {step + 1}" if last == step
                   else f"batches {step + 1}-{last + 1}")
        where = f"epoch {epoch + 1}, {batches} (counted from 1)"
    off = ("model$check_finite <- FALSE" if current_language() == "r"
           else "model.check_finite = False")
    message = (
        f"Non-finite training data in {where}: {'; '.join(parts)}. Training "
        "stopped before this batch changed the weights: a NaN or inf would "
        "have turned them into NaN. Remove or replace those rows (e.g. "
        "impute missing values) and train again; to train without this "
        f"check, set {off}."
    )
    return NonFiniteInputError(message, epoch=epoch, step=step,
                               inputs=labels)


def reporting(train_function, model):
    """Wraps a train function: a failed check raises `NonFiniteInputError`.

    Args:
        train_function: The model's `train_function`.
        model: The model it trains.

    Returns:
        A function of the same arguments.
    """

    def train(*args, **kwargs):
        try:
            return train_function(*args, **kwargs)
        except tf.errors.InvalidArgumentError as error:
            explained = explain_error(error, model)
            if explained is None:
                raise
            raise explained from None

    train.reports_nonfinite = True
    train.reported_function = train_function
    return train
