"""The JAX backend's runtime; imports no TensorFlow.

The counterpart of `multigpu.runtime.tensorflow`, function for function:
devices listed and split, device scopes, a variable's parts, the bytes of
a traced forward pass, a GPU's memory, waiting for a step's results, how
a step is run and timed for `ScalingMonitor`, where communication runs,
whether a trial pass is the default, how processes agree.
`multigpu.runtime.of_backend()` chooses between them. Also what only
JAX's runtime has: whether this process joined others (`is_joined`).
"""

import itertools

import jax
import keras
import numpy as np

from multigpu.messages import api, literal, setting
from multigpu.runtime.common import time_calls, warn_if_oversubscribed


def logical_devices(device_type):
    """Names of JAX's devices of one type, `"/device:CPU:0"`, ... (starts JAX).

    A device's index is its position among JAX's devices of its platform.

    Args:
        device_type: `"CPU"` or `"GPU"`.

    Returns:
        A list of canonical device names.

    Example:
    >>> logical_devices("CPU")
    ['/device:CPU:0', '/device:CPU:1']
    """
    if device_type == "CPU":
        found = jax.devices("cpu")
    else:
        found = [d for d in jax.devices() if d.platform == "gpu"]
    return [f"/device:{device_type}:{i}" for i in range(len(found))]


def virtual_devices(n, device_type, memory_limit, threads):
    """`multigpu.virtual_devices` on JAX: `n` CPU devices for JAX.

    JAX reads `jax_num_cpu_devices` when it starts its backends (at its
    first operation); afterwards the count is fixed for the process.

    Args:
        n: The number of devices, an int >= 1 (checked by the caller).
        device_type: `"CPU"` (JAX cannot split a GPU).
        memory_limit: None (the caller refuses it for CPUs).
        threads: None (XLA sizes the CPU devices' thread pools).

    Returns:
        The devices' canonical names.

    Raises:
        ValueError: for `device_type="GPU"` or a `threads` value.
        RuntimeError: when JAX already started with another count.

    Example:
    >>> virtual_devices(2, "CPU", None, None)
    ['/device:CPU:0', '/device:CPU:1']
    """
    if device_type != "CPU":
        raise ValueError(
            f"Invalid `device_type`: received {literal(device_type)} on the "
            "JAX backend, which cannot split a GPU into logical GPUs; "
            f"simulate devices with {setting('device_type', 'CPU')}."
        )
    if threads is not None:
        raise ValueError(
            f"Invalid `threads`: received {literal(threads)} on the JAX "
            "backend, where XLA sizes the CPU devices' thread pools itself; "
            f"leave it {literal(None)}."
        )
    names = [f"/device:CPU:{i}" for i in range(n)]
    warn_if_oversubscribed(n, device_type)
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        have = len(jax.devices("cpu"))
        if have == n:
            return names
        raise RuntimeError(
            f"{api('virtual_devices', n)} came too late: JAX already started, "
            f"with {have} CPU device(s), and fixes their number for the "
            f"process. Call {api('virtual_devices', 'n')} first thing, "
            "before building a model or creating a tensor, or restart the "
            "session."
        ) from None
    return names


def device(name):
    """The JAX device a canonical device name (`"/device:CPU:1"`) names.

    Its index is its position among JAX's devices of its platform, as
    `logical_devices` lists them.

    Raises:
        ValueError: if JAX has no such device.

    Example:
    >>> device("/device:CPU:1")
    CpuDevice(id=1)
    """
    kind, index = name.rsplit(":", 2)[-2:]
    if kind == "CPU":
        pool = jax.devices("cpu")
    else:
        pool = [d for d in jax.devices() if d.platform == "gpu"]
    if int(index) >= len(pool):
        raise ValueError(
            f"Invalid device {literal(name)}: JAX has {len(pool)} {kind} device(s)."
        )
    return pool[int(index)]


def device_scope(name):
    """A block whose new arrays and computations go to the device `name`.

    Example:
    >>> with device_scope("/device:CPU:1"):
    ...     model.fit(x, y)
    """
    return jax.default_device(device(name))


def variable_components(handle):
    """The per-device parts of a variable's value on JAX.

    Args:
        handle: A JAX array (a Keras variable's value), on one device or
            replicated or sharded over several.

    Returns:
        A list of `(device name, array)` pairs, devices named as
        `logical_devices` names them.

    Example:
    >>> variable_components(jax.numpy.zeros(3))
    [('/device:CPU:0', Array([0., 0., 0.], dtype=float32))]
    """
    shards = getattr(handle, "addressable_shards", None)
    if not shards:
        return [("/device:CPU:0", handle)]
    return [(_device_name(shard.device), shard.data) for shard in shards]


def _device_name(device):
    """`"/device:CPU:1"` for JAX's second CPU device."""
    kind = "CPU" if device.platform == "cpu" else "GPU"
    return f"/device:{kind}:{jax.devices(device.platform).index(device)}"


# What `forward_bytes` leaves out: views and broadcasts (which XLA fuses
# into the op that reads them).
_NO_NEW_BUFFER = frozenset({
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "copy",
    "copy_p", "stop_gradient",
})
# What the runtime is called in messages (`memory_plan`'s notes).
NAME = "JAX"


def forward_bytes(model, specs):
    """Bytes of the arrays a training-mode forward pass of `model` produces.

    The pass is traced by `jax.make_jaxpr` (nothing runs) on inputs of the
    given shapes; the outputs of its equations count once, calls counted
    inside, views left out (`_NO_NEW_BUFFER`). The batch itself counts.

    Args:
        model: A built Keras model.
        specs: `(shape, dtype)` of each input, in order.

    Returns:
        The bytes, an int.

    Example:
    >>> forward_bytes(keras.Sequential([keras.Input((4,)),
    ...                                 keras.layers.Dense(8)]),
    ...               [((2, 4), "float32")])
    160
    """
    specs = [jax.ShapeDtypeStruct(tuple(shape), str(dtype))
             for shape, dtype in specs]

    def forward(trainable, non_trainable, *xs):
        return model.stateless_call(
            trainable, non_trainable, xs[0] if len(xs) == 1 else list(xs),
            training=True)

    traced = jax.make_jaxpr(forward)(
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables], *specs)
    batch = sum(_aval_bytes(v.aval) for v in traced.jaxpr.invars[-len(specs):])
    return batch + _equation_bytes(traced.jaxpr)


def memory_limit(device_name):
    """Bytes of a GPU's memory, the `bytes_limit` JAX reports, or None.

    Example:
    >>> memory_limit("/device:GPU:0")
    15727656960
    """
    stats = device(device_name).memory_stats() or {}
    return stats.get("bytes_limit")


def _aval_bytes(aval):
    """Bytes of an abstract array of known shape (0 for keys and tokens)."""
    try:
        size = np.dtype(aval.dtype).itemsize
    except TypeError:
        return 0
    return int(np.prod(aval.shape, dtype=np.int64)) * size


def _inner_jaxprs(params):
    """The jaxprs an equation calls (`jit`, `custom_jvp_call`, `cond`, ...)."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            inner = getattr(item, "jaxpr", item)
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def _equation_bytes(jaxpr):
    """Bytes of the outputs of `jaxpr`'s equations, calls counted inside."""
    total = 0
    for equation in jaxpr.eqns:
        inner = _inner_jaxprs(equation.params)
        if inner:
            total += sum(_equation_bytes(j) for j in inner)
        elif equation.primitive.name not in _NO_NEW_BUFFER:
            total += sum(_aval_bytes(v.aval) for v in equation.outvars)
    return total


def wait(result):
    """`result` of a step once computed: JAX returns before a step ends.

    Example:
    >>> logs, state = wait(model.train_function(state, iterator))
    """
    jax.block_until_ready(result)
    return result


def is_joined():
    """Whether this process trains together with others (`jax.process_count() > 1`).

    The one test of it, for the JAX engine's mesh and for the agreement of
    the job's processes (`process_agreement`).

    Example:
    >>> is_joined()   # a process that trains alone
    False
    """
    return jax.process_count() > 1


def any_process(flag):
    """Whether `flag` is true in any process of the job.

    One gather of a number across the processes; every process must call
    it, and none returns before all have.

    Args:
        flag: This process's bool.

    Returns:
        A bool, the same in every process.

    Example:
    >>> stop = any_process(signal_arrived)
    """
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.int32(bool(flag)))
    return bool(np.asarray(flags).any())


def process_agreement():
    """How the processes JAX joined agree on a flag, or None when alone.

    Returns:
        `any_process` when this process trains together with others
        (`is_joined`), else None.

    Example:
    >>> agree = process_agreement()
    >>> stop = agree(caught) if agree else caught
    """
    return any_process if is_joined() else None


def first_step(step, args, steps, strategy):
    """Runs a train function's first call, keeping the batches it draws.

    `ScalingMonitor` trains its one-device baseline on the first batch of
    `fit`: the batches of one call are drawn here and the step runs on
    them, and returns once its results are computed (`wait`).

    Args:
        step: The train function, called as `step(state, iterator)`.
        args: The arguments `fit` called it with, the iterator last.
        steps: The batches one call draws (`steps_per_execution`).
        strategy: None (JAX has no `tf.distribute` strategy).

    Returns:
        `(logs, batch)`: the step's results and its first batch.

    Raises:
        StopIteration: when the iterator has no batch left.

    Example:
    >>> logs, batch = first_step(model.train_function, (state, iterator), 1,
    ...                          None)
    """
    del strategy
    *state, iterator = args
    batches = list(itertools.islice(iterator, steps))
    if not batches:
        raise StopIteration
    return wait(step(*state, iter(batches))), batches[0]


def holds_weights_in_step():
    """Whether Keras's trainer keeps the weights out of the model during `fit`.

    Returns:
        True: Keras's JAX trainer holds them in its own state during a
        step, so a copy of the model is made once the step has ended, after
        `sync_weights`.

    Example:
    >>> holds_weights_in_step()
    True
    """
    return True


def sync_weights(model):
    """Puts the weights `fit` trains back into `model`'s variables.

    Keras's JAX trainer keeps them out of the model during `fit`;
    `jax_state_sync` is Keras's way for callbacks to read them.

    Example:
    >>> sync_weights(model)   # in a callback, after a step
    """
    model.jax_state_sync()


def time_steps(copy, batch, steps):
    """Seconds of `steps` training steps of `copy` on `batch`, after one to trace.

    The copy trains one step by `train_on_batch` (which builds its
    optimizer and traces the step), then the timed steps through its train
    function, as `fit` calls it on JAX, each waited for (`wait`).

    Args:
        copy: A compiled Keras model on one device.
        batch: One batch as `fit` draws it: `(x, y)` or `(x, y, weights)`.
        steps: The timed steps, an int >= 1.

    Returns:
        A list of `steps` durations in seconds.

    Example:
    >>> time_steps(copy, (x, y), 5)
    [0.0031, 0.0029, 0.0030, 0.0030, 0.0029]
    """
    batch = keras.tree.map_structure(
        lambda a: a if a is None else np.asarray(a), batch)
    x, y, weights = keras.utils.unpack_x_y_sample_weight(batch)
    copy.train_on_batch(x, y, sample_weight=weights)
    # As `train_on_batch` gave it: the step traced there runs.
    batch = (x, y, weights)
    state = tuple(
        [v.value for v in variables] for variables in (
            copy.trainable_variables, copy.non_trainable_variables,
            copy.optimizer.variables, copy.metrics_variables))

    def step():
        nonlocal state
        _, state = wait(copy.train_function(state, iter([batch])))

    return time_calls(step, steps)


def communication_free(devices):
    """Whether a step on `devices` moves no bytes between them.

    Args:
        devices: Canonical device names.

    Returns:
        False: XLA's collectives run inside the compiled step, between CPU
        devices too.

    Example:
    >>> communication_free(["/device:CPU:0", "/device:CPU:1"])
    False
    """
    del devices
    return False


def where_communication_runs():
    """Where a step's communication runs, for `ScalingMonitor`'s notes.

    Example:
    >>> where_communication_runs()
    "Communication (XLA's all-reduces) runs inside the compiled step"
    """
    return "Communication (XLA's all-reduces) runs inside the compiled step"


def trial_by_default(devices):
    """Whether `find_batch_size` runs a trial pass when not told (`trial=None`).

    Args:
        devices: Canonical device names.

    Returns:
        False: the trial pass is TensorFlow's (`multigpu.runtime.tensorflow`).

    Example:
    >>> trial_by_default(["/device:GPU:0", "/device:GPU:1"])
    False
    """
    del devices
    return False
