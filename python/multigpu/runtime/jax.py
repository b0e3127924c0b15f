"""The JAX backend's runtime; imports no TensorFlow.

The counterpart of `multigpu.runtime.tensorflow`, function for function:
devices listed and split, device scopes, a variable's parts, the bytes of
a traced forward pass, a GPU's memory. `multigpu.runtime.of_backend()`
chooses between them.
"""

import jax
import numpy as np

from multigpu.messages import api, literal, setting
from multigpu.runtime.common import warn_if_oversubscribed


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
