"""A model as one replica's function: the forward path the TensorFlow engines share.

A batch is cut into row ranges (`split_bounds`); a model becomes a
function of flat tensors without losing the logits Keras's losses read,
with the losses its layers add and the values they write as outputs
(`flat_forward`, `held_effects`, `PassLayout`); it survives a share of zero
rows without a `tf.cond` (`padded_on_empty_share`); and the replicas' losses
combine into the whole batch's (`rows_weighted_loss`). Such a function runs
on its replica's device, its backward pass there too, by
`multigpu.engines.tensorflow.device_pass`.
"""

import contextlib
import contextvars

import keras
import tensorflow as tf

from multigpu import internals
from multigpu.messages import literal, setting
from multigpu.step import stateless


def split_bounds(batch_size, num_replicas):
    """Row boundaries of the sub-batches: `num_replicas + 1` offsets.

    Sub-batch `i` is rows `bounds[i]:bounds[i + 1]`. Sizes differ by at most
    one row and no row is lost; with fewer rows than
    replicas the first replicas get empty sub-batches. Works on Python ints
    and on scalar tensors.

    Example:
    >>> split_bounds(10, 4)
    [0, 2, 5, 7, 10]
    """
    return [(i * batch_size) // num_replicas for i in range(num_replicas + 1)]


def inference_on_empty_share(forward, inference_fn):
    """Runs a function of a batch on a share with no rows, by a `tf.cond`.

    For the pipeline's micro-batches (`multigpu.partition.pipeline`); the
    data-parallel engines pad instead (`padded_on_empty_share`), which keeps
    what the pass creates (losses, writes, cached dropout masks) out of a
    `tf.cond` branch.

    Returns a function of the same inputs that runs `forward` when the first
    input has rows. On zero rows it runs `inference_fn` on one row of zeros
    instead and returns its outputs cut to zero rows, with no gradient.
    Kernels fail on zero rows (oneDNN: MaxPoolGrad aborts the process, a
    convolution after MaxPooling reports "input depth must be evenly
    divisible by filter depth") and training mode would feed
    BatchNormalization NaN statistics; inference on one row has no side
    effects.

    Args:
        forward: A function of flat input tensors to a list of tensors.
        inference_fn: The same computation in inference mode.
    """

    def on_no_rows(rows, *inputs):
        outputs = inference_fn(*[one_row_of_zeros(x) for x in inputs])
        # `rows` (zero) rather than 0 keeps the batch size unknown in the
        # graph, as the other branch's.
        return [tf.stop_gradient(y[:rows]) for y in outputs]

    def run(*inputs):
        rows = tf.shape(inputs[0])[0]
        if inputs[0].shape[0] == 0:
            # Known to be empty (a replica's share of a batch with fewer
            # rows than replicas): tracing `forward` on a static batch of 0
            # would also trip Keras 3.15's `ops.add`, which takes a
            # (0, n) tensor for a bias and emits an invalid BiasAdd.
            return on_no_rows(rows, *inputs)
        scope = stateless.current()
        if scope is not None:
            # The NaN-guarded step: what the branches write leaves the cond as
            # outputs (see `stateless.StepScope.cond`).
            return scope.cond(rows > 0, lambda: forward(*inputs),
                              lambda: on_no_rows(rows, *inputs))
        return tf.cond(
            rows > 0,
            lambda: forward(*inputs),
            lambda: on_no_rows(rows, *inputs),
        )

    return run


def one_row_of_zeros(tensor):
    shape = tf.concat([[1], tf.shape(tensor)[1:]], axis=0)
    if tensor.dtype == tf.string:
        return tf.fill(shape, "")
    return tf.zeros(shape, tensor.dtype)


def flat_forward(model, inputs_struct, training, layout, pad=True,
                 hold_empty_writes=True):
    """`model` as one replica's function of flat inputs to flat outputs.

    The function returns, in this order (`layout` says where each part
    is, see `PassLayout`):

    * the model's flat outputs;
    * the logits Keras attached to softmax and sigmoid outputs
      (`_keras_logits`), which its cross-entropy losses use: exact and
      stable where log(clip(p)) is not. Concatenating outputs, or passing
      them through a custom gradient, would lose them;
    * the replica's layer-made loss (`add_loss`, `activity_regularizer`),
      summed into one scalar, when the model makes any;
    * the new values of the variables the pass wrote (BatchNormalization's
      moving statistics, seeds), which the caller commits
      (`PassLayout.commit`).

    The pass runs in a stateless scope of its own (`stateless.StepScope`),
    so that what it adds and writes leaves the function as outputs: a
    tensor made inside a replica's custom gradient is then never used
    outside it, and its gradient flows through the function.

    Args:
        model: A callable Keras model or layer.
        inputs_struct: The structure of its inputs.
        training: The `training` argument of the calls.
        layout: A `PassLayout`, filled in when the function is traced.
        pad: Survive a share of zero rows (see `padded_on_empty_share`).
        hold_empty_writes: With `pad`, a share of zero rows writes nothing
            (its row of zeros would set BatchNormalization's moving
            statistics); False when the writes are the same on every
            replica (statistics pooled across replicas).

    Returns:
        A function of the flat inputs to the list of flat outputs.
    """

    def forward(*flat):
        args = keras.tree.pack_sequence_as(inputs_struct, list(flat))
        with held_effects() as held:
            ys = keras.tree.flatten(model(args, training=training))
        return layout.flat(ys, held)

    if not pad:
        return forward
    return padded_on_empty_share(forward, layout, hold_empty_writes)


class PassLayout:
    """Where the parts of a `flat_forward` function's outputs are.

    Filled in when the function is traced; every replica traces the same
    model, so one layout serves the replicas of a call.

    Attributes:
        logits_at: The indices of the outputs whose logits follow them.
        has_loss: Whether the replica's layer-made loss follows the logits.
        written: The variables whose new values end the outputs.
    """

    def __init__(self):
        self.logits_at = []
        self.has_loss = False
        self.written = []

    def flat(self, ys, held):
        """A pass's flat outputs, its logits, loss and writes, laid out.

        Fills in the layout from what the pass made.

        Args:
            ys: The pass's flat outputs.
            held: The `held_effects` of the pass.

        Returns:
            The outputs, the logits of those that have them, the loss
            (when a layer added one) and the new values of the written
            variables, in one list (`split` takes it apart).
        """
        logits = [internals.logits_of(y) for y in ys]
        self.logits_at[:] = [i for i, z in enumerate(logits)
                             if z is not None]
        loss = held.loss()
        self.has_loss = loss is not None
        self.written[:] = [variable for variable, _ in held.writes]
        return (list(ys) + [logits[i] for i in self.logits_at]
                + ([loss] if loss is not None else [])
                + [value for _, value in held.writes])

    def split(self, flat_outputs):
        """`(outputs, loss, new_values)` of a `flat_forward` function's outputs.

        The outputs have their logits re-attached (`with_logits`); `loss`
        is None when the model adds none.
        """
        flat_outputs = list(flat_outputs)
        count = len(flat_outputs) - len(self.written)
        values, rest = flat_outputs[:count], flat_outputs[count:]
        loss = values.pop() if self.has_loss else None
        return with_logits(values, self.logits_at), loss, rest

    def commit(self, new_values):
        """Writes the pass's new values to its variables.

        In a stateless scope (the NaN-guarded step's) the writes are captured
        by that scope, as the layers' own writes would be.
        """
        for variable, value in zip(self.written, new_values):
            variable.assign(value)


class _Held:
    """What a pass added (`add_loss`) and wrote, from its own scope."""

    def __init__(self):
        self.losses = []
        self.writes = []

    def loss(self):
        """The losses added, summed to one scalar as Keras sums them; or None."""
        if not self.losses:
            return None
        floatx = keras.backend.floatx()
        return tf.add_n([tf.reduce_sum(tf.cast(x, floatx))
                         for x in self.losses])


@contextlib.contextmanager
def held_effects():
    """Runs a block in a stateless scope that keeps its losses and writes.

    Inside the NaN-guarded step's scope the block reads that scope's values
    (and notes its reads there); elsewhere it reads the variables. After
    the block, the losses its layers added are in `held.losses` and no
    longer in any layer (`model.losses` would count them again), and the
    writes are `held.writes`, `[(variable, new value)]`, for the caller to
    return as outputs and commit.

    Yields:
        The `_Held` record, filled when the block ends.

    Example:
    >>> with held_effects() as held:
    ...     y = model(x, training=True)
    >>> loss = held.loss()
    """
    scope = stateless.StepScope.within(internals.stateless_scope())
    held = _Held()
    with scope:
        yield held
        _check_no_variable_made(scope.updates())
    held.losses = list(scope.losses)
    held.writes = scope.updates()


def _check_no_variable_made(writes):
    """Refuses a variable made by a replica's pass under a strategy.

    An unseeded `keras.random` draw (`seed=None`) makes Keras's global
    seed generator on first use, inside the step: under
    `tf.distribute.MirroredStrategy` every replica thread makes its own,
    and the next trace of the step fails with TensorFlow's "tf.function
    only supports singleton tf.Variables" (plain Keras too).

    Raises:
        ValueError: naming the layer and the engine that takes it.
    """
    if tf.distribute.get_strategy().num_replicas_in_sync == 1:
        return
    for variable, _ in writes:
        if not internals.initialized(variable):
            layer = variable.path.split("/")[0]
            raise ValueError(
                f"Invalid `model` for {setting('engine', 'mirrored')}: its "
                f"layer {literal(layer)} draws random numbers without a "
                "seed generator of its own (keras.random with seed=None), "
                "which makes a variable inside each replica's step. Give "
                "the layer one: `self.seed_generator = "
                "keras.random.SeedGenerator(seed)` in `__init__` and "
                "`seed=self.seed_generator` in the draw. Or use "
                f"{setting('engine', 'replicate')}, which takes it as it "
                "is.")


def padded_on_empty_share(forward, layout, hold_empty_writes=True):
    """Runs a `flat_forward` function on at least one row, with no `tf.cond`.

    Kernels fail on zero rows (oneDNN: MaxPoolGrad aborts the process, a
    convolution after MaxPooling reports "input depth must be evenly
    divisible by filter depth") and BatchNormalization in training takes
    NaN statistics from them. A share of zero rows runs `forward` on one
    row of zeros instead; its outputs are cut back to zero rows, its loss
    is zero (a replica with no rows weighs nothing) and, with
    `hold_empty_writes`, its writes keep the values the variables had. A
    `tf.cond` would run only one branch but keeps inside it what the pass
    creates: the losses, and the dropout masks that Keras's recurrent
    cells cache between calls. A share with rows runs as it is, the
    padding costing the concatenation of no rows.

    `valid_rows` tells code inside the pass (the pooled
    BatchNormalization of `sync_batchnorm`) how many leading rows are the
    share's own.

    Args:
        forward: A function made by `flat_forward`.
        layout: Its `PassLayout`.
        hold_empty_writes: See `flat_forward`.

    Returns:
        A function of the same inputs to the same outputs.
    """

    def padded(*inputs):
        known = inputs[0].shape[0]
        if known:
            # Every share has rows: nothing to pad.
            return forward(*inputs)
        rows, padded_inputs = padded_to_one_row(inputs)
        before = _stored_values()
        token = valid_rows.set(rows)
        try:
            outputs = forward(*padded_inputs)
        finally:
            valid_rows.reset(token)
        outputs = list(outputs)
        count = len(outputs) - len(layout.written) - int(layout.has_loss)
        has_rows = rows > 0
        cut = [y[:rows] for y in outputs[:count]]
        if layout.has_loss:
            loss = outputs[count]
            cut.append(tf.where(has_rows, loss, tf.zeros_like(loss)))
        new_values = outputs[len(cut):]
        if hold_empty_writes:
            new_values = [_where(has_rows, value, before(variable))
                          for variable, value in zip(layout.written,
                                                     new_values)]
        return cut + new_values

    return padded


def _where(condition, value, old):
    """`value` if `condition` else `old`; `value` when there is no `old`."""
    return value if old is None else tf.where(condition, value, old)


def padded_to_one_row(inputs):
    """Inputs of one batch, a row of zeros after each when the batch has none.

    Args:
        inputs: Tensors whose first dimension is the batch, the same rows.

    Returns:
        `(rows, padded)`: the batch's row count (a scalar int32 tensor) and
        the inputs with one row of zeros added when it is 0, none otherwise
        (traced, their static first dimension is unknown).

    Example:

    >>> rows, padded = padded_to_one_row([tf.zeros((0, 3))])
    >>> int(rows), padded[0].shape
    (0, TensorShape([1, 3]))
    """
    rows = tf.shape(inputs[0])[0]
    missing = 1 - tf.minimum(rows, 1)
    return rows, [_padded(x, missing) for x in inputs]


def _padded(tensor, missing):
    """`tensor` with `missing` (0 or 1) rows of zeros after its rows.

    A concatenation, not `tf.pad`: oneDNN fuses a `Pad` whose paddings are
    computed in the graph into the convolution after it, and the fused
    kernel then reads zero rows ("Matrix size-incompatible: In[0]: [0,1]"
    in the layer after the convolution, TensorFlow 2.21 on CPU).
    """
    shape = tf.concat([[missing], tf.shape(tensor)[1:]], axis=0)
    if tensor.dtype == tf.string:
        filler = tf.fill(shape, "")
    else:
        filler = tf.zeros(shape, tensor.dtype)
    return tf.concat([tensor, filler], axis=0)


def _stored_values():
    """A function of a variable to its value before the pass.

    In a stateless scope, the value the scope maps it to (when it does);
    elsewhere, the variable as stored; None for a variable the pass
    created (an unseeded `keras.random` draw's seed generator, made on
    first use), which had no value before.
    """
    scope = internals.stateless_scope()
    mapping = dict(scope.state_mapping) if scope is not None else {}

    def before(variable):
        value = mapping.get(id(variable))
        if value is not None or not internals.initialized(variable):
            return value
        return internals.stored_value(variable)

    return before


# How many leading rows of the share being run are its own (the rest is
# `padded_on_empty_share`'s row of zeros); None: every row.
valid_rows = contextvars.ContextVar("multigpu_valid_rows", default=None)


def rows_weighted_loss(losses, bounds):
    """The replicas' layer-made losses combined as the whole batch's.

    Replica `i` ran on rows `bounds[i]:bounds[i + 1]` and its layers added
    `losses[i]`; the combined loss is the row-weighted mean
    `sum_i (n_i / n) * losses[i]`, where replica `i` has `n_i` of the `n`
    rows. This equals the loss the template adds on the whole batch when
    that loss is a mean over the rows (an `activity_regularizer`, which
    Keras divides by the rows the layer sees; a KL term taken as a batch
    mean) or does not depend on the rows (a weight penalty added in
    `call`): a replica with no rows weighs nothing. A loss that is a *sum*
    over the rows would come out divided by the replica count instead;
    write it as a mean to train it on several devices.

    Args:
        losses: Per replica, its loss (a scalar tensor) or None when the
            model adds none (then every replica's is None).
        bounds: The `split_bounds` of the batch (tensors or ints).

    Returns:
        A scalar tensor, or None when no replica has a loss.

    Example:
    >>> bounds = split_bounds(10, 4)  # rows 2/3/2/3
    >>> rows_weighted_loss([l0, l1, l2, l3], bounds)  # (2*l0 + 3*l1 + ...) / 10
    """
    if all(loss is None for loss in losses):
        return None
    if len(losses) == 1:
        return losses[0]
    dtype = losses[0].dtype
    total = tf.cast(bounds[-1] - bounds[0], dtype)
    weighted = [loss * tf.math.divide_no_nan(
        tf.cast(bounds[i + 1] - bounds[i], dtype), total)
        for i, loss in enumerate(losses)]
    return tf.add_n(weighted)


def with_logits(flat_outputs, logits_at):
    """The outputs of a `flat_forward` function, its logits re-attached."""
    values = list(flat_outputs[: len(flat_outputs) - len(logits_at)])
    for index, logits in zip(logits_at, flat_outputs[len(values):]):
        try:
            internals.attach_logits(values[index], logits)
        except AttributeError:  # eager tensors take no attributes
            pass
    return values


def leading_rows_with_logits(tensor, rows):
    """The first `rows` rows of an output, the logits Keras attached to it
    cut the same way.

    Args:
        tensor: An output of a model (a batch first).
        rows: A scalar int32 tensor, at most the tensor's row count.

    Returns:
        The cut tensor, carrying the cut logits when `tensor` had them.
    """
    cut = tensor[:rows]
    logits = internals.logits_of(tensor)
    if logits is None:
        return cut
    return with_logits([cut, logits[:rows]], [0])[0]


def concat_with_logits(parts):
    """Parts of one output (replicas', micro-batches'), concatenated by rows.

    The logits Keras attached to each part are concatenated too and
    attached to the result, when every part has them.
    """
    merged = tf.concat(parts, axis=0)
    logits = [internals.logits_of(part) for part in parts]
    if all(z is not None for z in logits):
        return with_logits([merged, tf.concat(logits, axis=0)], [0])[0]
    return merged
