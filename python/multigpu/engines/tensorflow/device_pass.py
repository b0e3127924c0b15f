"""A replica's pass on its device: its backward pass there, XLA if asked.

TensorFlow 2's tape places every backward op on the default device; a
function of flat tensors run by `on_device` keeps its gradient on the
replica's device (`tf.gradients` colocates each gradient op with its
forward op). With the variables it reads, the pass and its gradient are
one XLA-compiled function on the device instead (`compiled_on`; for a
replica a strategy places, `run_pass`); `resolve_jit_compile` decides
whether a model's replicas compile, as Keras's `jit_compile` does. The
functions run here are made by `multigpu.engines.tensorflow.forward`.
"""

import platform
import warnings

import keras
import tensorflow as tf

from multigpu import internals
from multigpu.engines.tensorflow.trainer import layer_without_jit
from multigpu.messages import literal, setting
from multigpu.step import stateless


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

    In the NaN-guarded training step (a `stateless.StepScope`), the forward
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


def on_device(device, forward, flat_inputs, compiled_over=None):
    """`forward(*flat_inputs)` on `device`, backward pass there too in graphs.

    Args:
        device: The replica's device.
        forward: A function of flat tensors to a list of tensors.
        flat_inputs: Its inputs.
        compiled_over: None to run `forward` as it is; else the variables
            its pass reads, and `forward` and its gradient are compiled by
            XLA on `device` (`compiled_on`). Eager calls (a model called
            directly, `run_eagerly=True`) run as they are, as Keras's
            `jit_compile` compiles only its traced steps.
    """
    if tf.executing_eagerly():
        # `tf.gradients` needs a graph; eager runs are for debugging.
        with tf.device(device):
            return forward(*flat_inputs)
    if compiled_over is not None:
        return compiled_on(device, forward, flat_inputs, compiled_over)
    return _differentiable_on(device, forward, flat_inputs)


def _without_xla(model):
    """Why XLA cannot compile `model`'s replicas, or None.

    Keras's reasons for the template (`keras.src.trainers.trainer.
    model_supports_jit`: a layer whose `supports_jit` is False,
    TensorFlow on an Apple GPU; not its third, op determinism, which only
    a private TensorFlow function tells), a string input (XLA takes
    none), and the engine's own: with `sync_batchnorm`, each replica's
    pass pools BatchNormalization's statistics with the other replicas'.
    """
    template = model.template
    layer = layer_without_jit(template)
    if layer is not None:
        return (f"its layer {literal(layer.name)} ({type(layer).__name__}) "
                "is one XLA cannot compile (its supports_jit is False), as "
                "Keras's compile of the template says")
    if (platform.system() == "Darwin" and "arm" in platform.processor().lower()
            and tf.config.list_physical_devices("GPU")):
        return "TensorFlow has no XLA for Apple GPUs, as Keras says"
    strings = [t for t in keras.tree.flatten(getattr(template, "inputs", None)
                                             or [])
               if str(getattr(t, "dtype", "")) == "string"]
    if strings:
        return (f"its input {literal(strings[0].name)} holds strings, which "
                "XLA does not take")
    if getattr(model, "sync_batchnorm", False):
        return (f"with {setting('sync_batchnorm', True)} each replica's pass "
                "pools BatchNormalization's statistics with the other "
                "replicas', which XLA cannot compile into one replica's "
                "cluster")
    return None


def resolve_jit_compile(model, value):
    """What `jit_compile=value` runs on a data-parallel engine's `model`.

    True compiles each replica's forward and backward pass with XLA on
    its device (`compiled_on`), unless the model cannot be compiled
    (`_without_xla`) or runs eagerly: then it runs without XLA, with a
    warning naming the reason, as Keras's compile falls back for a model
    that does not support XLA. "auto" is Keras's choice for the template
    on one device (`keras.Model.compile`): False when run eagerly, on a
    machine with no accelerator (Keras "disables XLA on CPU-only
    machines") or for a model XLA cannot compile; True otherwise. False
    (and anything false) runs without XLA.

    Args:
        model: A `ParallelModel` or `MirroredModel` (its `template`,
            `run_eagerly` and `sync_batchnorm`).
        value: True, False or "auto".

    Returns:
        A bool: whether XLA compiles each replica's pass.
    """
    eager = bool(getattr(model, "run_eagerly", False))
    if isinstance(value, str) and value == "auto":
        accelerators = [d for d in tf.config.list_physical_devices()
                        if d.device_type != "CPU"]
        return bool(not eager and accelerators
                    and _without_xla(model) is None)
    if not value:
        return False
    reason = ("the model runs eagerly (run_eagerly=True), as Keras's compile "
              "refuses both" if eager else _without_xla(model))
    if reason is None:
        return True
    warnings.warn(
        f"{setting('jit_compile', value)}: the replicas run without XLA, as "
        f"{reason}; the model's jit_compile is False.",
        UserWarning, stacklevel=4)
    return False


def run_pass(forward, flat_inputs, compiled_over=None):
    """`forward(*flat_inputs)` where it is, XLA-compiled with `compiled_over`.

    For a replica that a strategy already places on its device (the
    mirrored engine): with `compiled_over` (the variables the pass reads),
    the pass is one XLA-compiled function (`xla_function`) whose gradient,
    taken by the step's tape in the replica's context, is compiled too.
    """
    if compiled_over is None or tf.executing_eagerly():
        return forward(*flat_inputs)
    variables = list(compiled_over)
    return xla_function(forward, flat_inputs, variables)(
        *flat_inputs, *values_before(variables))


def xla_function(forward, flat_inputs, variables):
    """`forward` as a function XLA compiles, its variables' values as inputs.

    The function takes the flat inputs and then one value per variable,
    and runs `forward` in a `stateless.StepScope` that maps each variable
    to its value: the compiled cluster reads no resource variable (XLA
    cannot read one held on another device: TensorFlow's "Trying to
    access resource ... located in device ..."), and what the pass writes
    leaves it as outputs already (`flat_forward`). Its gradient function,
    made by TensorFlow from the function's, carries the same
    `_XlaMustCompile` attribute: the backward pass is compiled too.

    Args:
        forward: A function made by `flat_forward`.
        flat_inputs: Its inputs (how many the function takes first).
        variables: The variables the pass reads.

    Returns:
        A `tf.function(jit_compile=True)` of `(*flat_inputs, *values)`.
    """
    count = len(flat_inputs)
    variables = list(variables)

    def stateless_forward(*args):
        with stateless.StepScope([], variables, values=list(args[count:])):
            return list(forward(*args[:count]))

    return tf.function(stateless_forward, jit_compile=True, autograph=False)


def values_before(variables):
    """The values the pass reads for `variables`, read outside the pass.

    In the NaN-guarded step's scope, the scope's values (its trainable
    ones watched by the step's tape); elsewhere each variable read once,
    as stored (the tape reaches the variable through the read).
    """
    scope = internals.stateless_scope()
    mapping = dict(scope.state_mapping) if scope is not None else {}
    return [mapping[id(v)] if mapping.get(id(v)) is not None
            else internals.stored_value(v) for v in variables]


def compiled_on(device, forward, flat_inputs, variables):
    """`forward(*flat_inputs)` compiled by XLA on `device`, its gradient too.

    `forward` runs as one XLA-compiled function call on `device`
    (`xla_function`), the variables' values read outside it and passed
    in. Its gradient is the gradient function TensorFlow makes for the
    call, compiled too, placed on `device` by `tf.gradients`, which
    colocates each gradient op with its forward op (as `_differentiable_on`
    does for an uncompiled replica).

    Args:
        device: The replica's device.
        forward: A function made by `flat_forward`.
        flat_inputs: Its inputs.
        variables: The variables the pass reads (trainable and not).

    Returns:
        The outputs of `forward`.
    """
    variables = list(variables)
    values = values_before(variables)
    function = xla_function(forward, flat_inputs, variables)
    with tf.device(device):
        ys = function(*flat_inputs, *values)
    trainable = [value for v, value in zip(variables, values) if v.trainable]

    @tf.custom_gradient
    def replica(*xs):
        return list(ys), _backward(ys, xs)

    with tf.device(device):
        return replica(*flat_inputs, *trainable)
