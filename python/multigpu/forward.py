"""Running a model's function on a device: the forward path every engine shares.

A batch is cut into row ranges (`split_bounds`); a function of flat tensors
runs on a device with its backward pass there too (`on_device`); a function
survives a batch of zero rows (`forward_only_when_empty`); and a model
becomes such a function without losing the logits Keras's losses read
(`flat_forward`, `with_logits`).
"""

import keras
import tensorflow as tf

from multigpu import internals, stateless

HOST_DEVICE = "/device:CPU:0"


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


def _is_zeros(tensor):
    """Whether `tensor` is the all-zeros gradient the tape gives unused outputs."""
    op = tensor.op
    if op.type == "ZerosLike":
        return True
    if op.type in ("Fill", "Const"):
        value = tf.get_static_value(op.inputs[1] if op.type == "Fill" else tensor)
        return value is not None and not value.any()
    return False


def _differentiable_on(device, forward, flat_inputs):
    """Runs `forward(*flat_inputs)` on `device`, its gradient there too.

    TensorFlow 2's tape places every backward op on the default device, which
    would run all replicas' backward passes on one device. `tf.gradients`
    colocates each gradient op with its forward op, so the backward pass of a
    replica stays on the replica's device. Outputs whose gradient is the
    tape's all-zeros filler (no loss uses them, or the loss uses their
    logits instead) are left out of the backward pass rather than
    differentiated as zeros.

    In the guarded training step (a `stateless.StepScope`), the forward
    pass reads the trainable variables' values from the scope: those it
    read are inputs of the function too (`_differentiable_on_values`).
    """
    scope = stateless.current()
    if scope is not None:
        return _differentiable_on_values(scope, device, forward, flat_inputs)

    @tf.custom_gradient
    def replica(*xs):
        with tf.device(device):
            ys = forward(*xs)
        return ys, _backward(ys, xs)

    return replica(*flat_inputs)


def _backward(ys, xs):
    """The gradient function of `ys` over the inputs `xs` and variables.

    For `tf.custom_gradient`: `tf.gradients` from the outputs whose
    gradient is not the tape's all-zeros filler.
    """

    def grad(*dys, variables=None):
        variables = list(variables or [])
        sources = list(xs) + variables
        used = [(y, dy) for y, dy in zip(ys, dys)
                if dy is not None and not _is_zeros(dy)]
        if not used:
            return [None] * len(xs), [None] * len(variables)
        # Each input is a separate source: with one input computed from
        # another (a stem feeding this stage both directly and through an
        # earlier stage), `tf.gradients` would otherwise also differentiate
        # through that earlier stage, whose own gradient function counts
        # the same path again.
        grads = tf.gradients([y for y, _ in used], sources,
                             grad_ys=[dy for _, dy in used],
                             stop_gradients=list(xs))
        return grads[: len(xs)], grads[len(xs):]

    return grad


def _differentiable_on_values(scope, device, forward, flat_inputs):
    """`_differentiable_on` in a `StepScope`: values instead of variables.

    The forward pass is traced first, noting which variables' values it
    reads; the values of the trainable ones are then inputs of the
    function with the custom gradient, beside `flat_inputs`, so that the
    step's tape, watching them, reaches them (a value read from the scope
    is a tensor, which `tf.custom_gradient`'s `variables` would not see).
    """
    with scope.reading() as read, tf.device(device):
        ys = forward(*flat_inputs)
    values = [scope.value_of(v) for v in scope.trainable if id(v) in read]

    @tf.custom_gradient
    def replica(*xs):
        return list(ys), _backward(ys, xs)

    # The IdentityN that carries the custom gradient on the device too:
    # the forward pass there reads the values and inputs already.
    with tf.device(device):
        return replica(*flat_inputs, *values)


def on_device(device, forward, flat_inputs):
    """`forward(*flat_inputs)` on `device`, backward pass there too in graphs."""
    if tf.executing_eagerly():
        # `tf.gradients` needs a graph; eager runs are for debugging.
        with tf.device(device):
            return forward(*flat_inputs)
    return _differentiable_on(device, forward, flat_inputs)


def forward_only_when_empty(forward, inference_fn):
    """Guards a function of a batch against batches of zero rows.

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

    def guarded(*inputs):
        rows = tf.shape(inputs[0])[0]
        if inputs[0].shape[0] == 0:
            # Known to be empty (a replica's share of a batch with fewer
            # rows than replicas): tracing `forward` on a static batch of 0
            # would also trip Keras 3.15's `ops.add`, which takes a
            # (0, n) tensor for a bias and emits an invalid BiasAdd.
            return on_no_rows(rows, *inputs)
        scope = stateless.current()
        if scope is not None:
            # The guarded step: what the branches write leaves the cond as
            # outputs (see `stateless.StepScope.cond`).
            return scope.cond(rows > 0, lambda: forward(*inputs),
                              lambda: on_no_rows(rows, *inputs))
        return tf.cond(
            rows > 0,
            lambda: forward(*inputs),
            lambda: on_no_rows(rows, *inputs),
        )

    return guarded


def one_row_of_zeros(tensor):
    shape = tf.concat([[1], tf.shape(tensor)[1:]], axis=0)
    if tensor.dtype == tf.string:
        return tf.fill(shape, "")
    return tf.zeros(shape, tensor.dtype)


def flat_forward(model, inputs_struct, training, logits_at, guard=True):
    """`model` as a function of flat inputs to flat outputs and their logits.

    Keras attaches to softmax and sigmoid outputs the logits they were
    computed from (`_keras_logits`), and its cross-entropy losses use them:
    exact and stable where log(clip(p)) is not. Concatenating outputs, or
    passing them through a `tf.cond`, would lose them, so the function also
    returns the logits; `logits_at` receives the indices of the outputs that
    have them (`with_logits` puts them back).

    Args:
        model: A callable Keras model or layer.
        inputs_struct: The structure of its inputs.
        training: The `training` argument of the calls.
        logits_at: A list, filled in when the function is traced.
        guard: Survive a batch of zero rows (see
            `forward_only_when_empty`).
    """

    def forward_in(mode):
        def forward(*flat):
            args = keras.tree.pack_sequence_as(inputs_struct, list(flat))
            ys = keras.tree.flatten(model(args, training=mode))
            logits = [internals.logits_of(y) for y in ys]
            logits_at[:] = [i for i, z in enumerate(logits) if z is not None]
            return ys + [logits[i] for i in logits_at]

        return forward

    if not guard:
        return forward_in(training)
    return forward_only_when_empty(forward_in(training), forward_in(False))


def with_logits(flat_outputs, logits_at):
    """The outputs of a `flat_forward` function, its logits re-attached."""
    values = list(flat_outputs[: len(flat_outputs) - len(logits_at)])
    for index, logits in zip(logits_at, flat_outputs[len(values):]):
        try:
            internals.attach_logits(values[index], logits)
        except AttributeError:  # eager tensors take no attributes
            pass
    return values


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
