"""JAX across processes: one device mesh over every worker's devices.

When the job has several processes (`multigpu.cluster.processes`: the
launcher's or a TFJob's `TF_CONFIG`, or a Slurm step of several tasks),
`join` connects this process to the others through JAX's own runtime
(`jax.distributed.initialize`) before JAX starts its devices, with gloo
collectives between CPU devices. JAX then lists every process's devices
(`jax.devices()`; `jax.local_devices()` are this process's), so
`multi_gpu_model(model, gpus=None)` builds its mesh over all of them, and
the compiled step all-reduces across processes as it does across one
process's devices.

Every process runs the same program on the same data: each one places the
shards of a batch that its own devices hold, from its own copy of the
batch. `check_same_batch` makes sure the copies agree, so a worker that
shuffles with another seed stops training instead of mixing batches.
"""

import zlib

import jax
import numpy as np

from multigpu.cluster import readiness
from multigpu.cluster.processes import process_group
from multigpu.messages import literal
from multigpu.runtime import jax as jax_runtime

# Seconds a process waits for the others to join (JAX's default is 300);
# the launcher's own start-up deadline (`--startup-timeout`) is shorter.
JOIN_TIMEOUT_SECONDS = 300


def join(environ=None):
    """Joins the job's other processes, when there are any.

    Call it before JAX's first computation: `import multigpu` does, on the
    JAX backend. Once joined, the process tells `multigpu.launch` so
    (`readiness.signal_ready`).

    Args:
        environ: The environment to read; `os.environ` when None.

    Returns:
        The `ProcessGroup` joined, or None for a process that trains alone
        (or that joined already, through `jax.distributed` itself).

    Raises:
        RuntimeError: when JAX has computed already, so that it can no
            longer join; the message says what to move.
        ProcessGroupError: for a malformed `TF_CONFIG` or Slurm step.

    Example:
    >>> join()   # worker 1 of `python -m multigpu.launch --workers 2`
    ProcessGroup(coordinator='127.0.0.1:41825', count=2, index=1, source='TF_CONFIG')
    """
    group = process_group(environ)
    if group is None or jax.distributed.is_initialized():
        return None
    # Collectives between CPU devices of different processes need gloo;
    # GPUs use NCCL whatever this says. Like the join, it must come before
    # JAX starts its devices.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            group.coordinator, group.count, group.index,
            initialization_timeout=JOIN_TIMEOUT_SECONDS)
    except RuntimeError as error:
        if "before" not in str(error):
            raise
        raise RuntimeError(
            f"This process is process {group.index} of {group.count} of a "
            f"training job ({group.source}), but JAX computed before multigpu "
            "could join the others, and JAX joins only before its first "
            "computation. Import multigpu (in R, call a multigpu function "
            "such as virtual_devices()) before creating any model, array or "
            "device."
        ) from None
    readiness.signal_ready(group.index)
    return group


def check_devices_span_processes(devices, jax_devices):
    """Refuses a device set that leaves a process of the job without devices.

    Every process runs every compiled step; one that owns none of its
    devices would compute nothing and wait for the others forever.

    Args:
        devices: The canonical names asked for (`resolve_devices`).
        jax_devices: The JAX devices they name, in order.

    Raises:
        ValueError: naming the processes left out and the fix.

    Example:
    >>> check_devices_span_processes(names, [jax_runtime.device(n) for n in names])
    """
    if not jax_runtime.is_joined():
        return
    owners = {device.process_index for device in jax_devices}
    missing = sorted(set(range(jax.process_count())) - owners)
    if missing:
        raise ValueError(
            f"Invalid `gpus`: {literal(list(devices))} are devices of process(es) "
            f"{sorted(owners)} only, and this job has {jax.process_count()} "
            f"processes; process(es) {missing} would have nothing to compute. "
            f"Pass {literal(None)} (every process's devices), or devices of "
            "every process."
        )


def _fingerprint(leaves):
    """Numbers that differ when the arrays differ: per array, its size and CRC-32.

    Small ints (16-bit halves), which every process's JAX gathers exactly
    whether or not it runs with 64-bit types.
    """
    numbers = []
    for leaf in leaves:
        values = np.ascontiguousarray(leaf)
        checksum = zlib.crc32(values.view(np.uint8).reshape(-1) if values.size
                              else b"")
        numbers += [values.size % 2**16, values.size // 2**16,
                    checksum % 2**16, checksum // 2**16]
    return np.asarray(numbers, np.int32)


def check_same_batch(leaves):
    """Stops when the processes of the job hold different batches.

    One gather of a few numbers per array (its size and CRC-32) across
    the processes; JAX's own check of `jax.device_put` gathers the whole
    arrays.

    Args:
        leaves: This process's batch, as a list of arrays.

    Raises:
        ValueError: when any process's batch differs from process 0's,
            naming the processes and the fix (the same data and seed on
            every process).

    Example:
    >>> check_same_batch([x, y])   # the same on every process
    """
    from jax.experimental import multihost_utils

    every = np.asarray(multihost_utils.process_allgather(_fingerprint(leaves)))
    differ = [i for i, row in enumerate(every) if not np.array_equal(row, every[0])]
    if differ:
        raise ValueError(
            f"Process(es) {differ} of this job hold another batch than process "
            "0. Every process must pass the same data in the same order: the "
            "same arrays and, for shuffled data, the same seed "
            "(keras.utils.set_random_seed(...) before building the model; in "
            "R, keras3::set_random_seed()), or shuffle=False."
        )


def put_global(leaves, shardings):
    """Places a batch on devices of several processes, from this process's copy.

    Each process checks that the copies agree (`check_same_batch`), then
    puts only the shards its own devices hold.

    Args:
        leaves: The batch's arrays (None passes through).
        shardings: One `jax.sharding.Sharding` per array, over the devices
            of every process.

    Returns:
        One global `jax.Array` per array.

    Example:
    >>> x, y = put_global([x, y], [split, split])
    """
    check_same_batch([leaf for leaf in leaves if leaf is not None])

    def put(value, sharding):
        if value is None:
            return None
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding,
                                            lambda index: value[index])

    return [put(value, sharding) for value, sharding in zip(leaves, shardings,
                                                            strict=True)]


def from_process_0(values, sharding):
    """Places process 0's `values` whole on every device of `sharding`.

    Every process builds the model itself; what the job trains is process
    0's weights (and random-generator states), which every process then
    holds, as Horovod's broadcast of the initial variables does. So a
    process whose model was built from another seed, or restored with
    another random state, still trains the same model.

    Args:
        values: This process's arrays (the template's variables' values).
        sharding: A replicated sharding over devices of every process.

    Returns:
        One global `jax.Array` per value, process 0's value everywhere.

    Example:
    >>> placed = from_process_0([v.value for v in variables], replicated(mesh))
    """
    from jax.experimental import multihost_utils

    first = multihost_utils.broadcast_one_to_all(
        [np.asarray(value) for value in values])
    return [jax.make_array_from_callback(value.shape, sharding,
                                         lambda index, value=value: value[index])
            for value in map(np.asarray, first)]
