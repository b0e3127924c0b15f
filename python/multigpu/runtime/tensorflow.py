"""The TensorFlow backend's runtime: its logical devices, split and listed.

The counterpart of `multigpu.runtime.jax`, function for function (devices
listed and split, device scopes, a variable's parts, the bytes of a traced
forward pass, a GPU's memory, waiting for a step's results, how a step is
run and timed for `ScalingMonitor`, where communication runs, whether a
trial pass is the default, how processes agree without a strategy);
`multigpu.runtime.of_backend()` chooses between them. Also what only TensorFlow's runtime has: restarting it while
nothing lives on its devices, the thread pools of logical CPU devices, and
a trial pass that may run out of memory.
"""

import collections
import dataclasses
import gc
import os
import warnings

import keras
import numpy as np
import tensorflow as tf

from multigpu import tensorflow_internals
from multigpu.messages import api, current_language, literal
from multigpu.runtime.common import (
    time_calls,
    usable_cores,
    warn_if_oversubscribed,
)


@dataclasses.dataclass
class ThreadsState:
    """The thread pools `virtual_devices` sized, kept for the process.

    Attributes:
        configured: Whether logical CPU devices were configured (their
            thread pools are sized once, when TensorFlow starts).
        threads: The `threads` they were configured with (None: default).
    """

    configured: bool = False
    threads: int | None = None

    def reset(self):
        """Forgets the configuration (for tests that simulate a fresh process)."""
        self.configured = False
        self.threads = None


STATE = ThreadsState()


def logical_devices(device_type):
    """Names of TensorFlow's logical devices of one type (initialises TF).

    Args:
        device_type: `"CPU"` or `"GPU"`.

    Returns:
        A list of device names, `"/device:CPU:0"`, ...

    Example:
    >>> logical_devices("GPU")
    []
    """
    return [d.name for d in tf.config.list_logical_devices(device_type)]


def virtual_devices(n, device_type, memory_limit, threads):
    """`multigpu.virtual_devices` on TensorFlow: its logical devices.

    Splits the first physical device of `device_type` into `n` logical
    devices before TensorFlow initialises them; a started TensorFlow with
    nothing on its devices is restarted first (`restart_unused_tensorflow`).

    Args:
        n: The number of devices, an int >= 1 (checked by the caller).
        device_type: `"CPU"` or `"GPU"`.
        memory_limit: For GPUs, each logical GPU's memory in MiB; None for
            CPUs.
        threads: For CPUs, the intra-op threads of each device's pool, None
            for its share of the cores, 0 for one shared pool.

    Returns:
        The logical devices' names.

    Raises:
        ValueError: when the machine has no physical device of that type.
        RuntimeError: when TensorFlow started with another layout and
            objects still live on its devices.

    Example:
    >>> virtual_devices(2, "CPU", None, None)
    ['/device:CPU:0', '/device:CPU:1']
    """
    physical = tf.config.list_physical_devices(device_type)
    if not physical:
        raise ValueError(
            f"Invalid `device_type`: received {literal(device_type)} but this "
            f"machine has no physical {device_type}."
        )
    limit = None if memory_limit is None else int(memory_limit)
    configs = [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * n
    names = [f"/device:{device_type}:{i}" for i in range(n)]
    current = tf.config.get_logical_device_configuration(physical[0]) or []
    if len(current) == n and all(c.memory_limit == limit for c in current):
        _warn_if_threads_ignored(n, threads)
        return names
    warn_if_oversubscribed(n, device_type)
    try:
        tf.config.set_logical_device_configuration(physical[0], configs)
    except RuntimeError:
        _too_late(api('virtual_devices', n), len(current) or 1, device_type,
                  physical[0].name)
        tf.config.set_logical_device_configuration(physical[0], configs)
    if device_type == "CPU" and n > 1:
        _own_thread_pools(n, threads)
        STATE.configured, STATE.threads = True, threads
    return names


def objects_on_devices():
    """What lives on TensorFlow's devices now: tensors, variables, Keras objects.

    Returns:
        Counts by kind, most common first, such as `"3 tensors"` or
        `"1 Keras model"`; empty when nothing of the kind exists.

    Example:
    >>> objects_on_devices()   # in a fresh process
    []
    """
    gc.collect()
    counts = collections.Counter()
    eager_tensor = tensorflow_internals.eager_tensor_type()
    # By type only: the heap holds lazy modules that load on attribute access.
    for kind in map(type, gc.get_objects()):
        if issubclass(kind, keras.Model):
            counts["Keras model"] += 1
        elif issubclass(kind, keras.Optimizer):
            counts["Keras optimizer"] += 1
        elif issubclass(kind, tf.Variable):
            counts["variable"] += 1
        elif issubclass(kind, eager_tensor):
            counts["tensor"] += 1
    return [f"{count} {noun}{'' if count == 1 else 's'}"
            for noun, count in counts.most_common()]


def restart_unused_tensorflow():
    """Restarts a started TensorFlow when nothing lives on its devices.

    Something may start TensorFlow before the program configures it: R's
    keras3, for one, converts a value to a tensor in its load hook on the
    Python module `keras`, and `import tensorflow` imports keras. When no
    tensor, variable or Keras model of that start is left, a restart loses
    nothing, and devices and collective ops can be configured again.

    Returns:
        What still lives on the devices (see `objects_on_devices`): empty
        when TensorFlow had not started or was restarted; otherwise the
        caller explains that it came too late.

    Example:
    >>> restart_unused_tensorflow()
    []
    """
    if not tensorflow_internals.tensorflow_started():
        return []
    alive = objects_on_devices()
    if not alive:
        tensorflow_internals.restart_tensorflow()
    return alive


def first_thing_where():
    """Where a call that configures TensorFlow belongs, in the caller's language."""
    if current_language() == "r":
        return (" (right after library(keras3) and library(multigpu); remove "
                "what exists with rm() to reconfigure without a restart)")
    return " (remove what exists with del to reconfigure without a restart)"


def device_scope(name):
    """A block whose new tensors and ops go to the device `name`.

    Example:
    >>> with device_scope("/device:CPU:1"):
    ...     model.fit(x, y)
    """
    return tf.device(name)


def variable_components(handle):
    """The per-device parts of a variable's value on TensorFlow.

    Args:
        handle: A TensorFlow variable, or one mirrored by a `tf.distribute`
            strategy (one component per device).

    Returns:
        A list of `(device name as TensorFlow gives it, component)` pairs.

    Example:
    >>> variable_components(tf.Variable(1.0))
    [('/job:localhost/replica:0/task:0/device:CPU:0', <tf.Variable ...>)]
    """
    if isinstance(handle, tf.distribute.DistributedValues):
        parts = list(handle.values)
    else:
        parts = [handle]
    return [(part.device, part) for part in parts]


def _too_late(call, have, device_type, physical_name):
    """Restarts an unused TensorFlow, or raises saying what is in the way."""
    alive = restart_unused_tensorflow()
    if not alive:
        return
    raise RuntimeError(
        f"{call} came too late: TensorFlow already started, with {have} "
        f"logical {device_type} device(s) on {physical_name}, and objects "
        f"created on those devices still exist ({', '.join(alive)}). Logical "
        "devices can only be configured while no tensor, variable or model "
        f"exists: call {api('virtual_devices', 'n')} first thing, before "
        f"building a model or creating a tensor{first_thing_where()}, or "
        "restart the session."
    ) from None


def _warn_if_threads_ignored(n, threads):
    """A repeated call cannot resize the thread pools: say so."""
    if threads is None or not STATE.configured or STATE.threads == threads:
        return
    warnings.warn(
        f"{api('virtual_devices', f'{n}, threads={literal(threads)}')} is "
        f"ignored: the {n} devices already exist with threads="
        f"{literal(STATE.threads)}, and thread pools are sized once, "
        "when TensorFlow starts. Pass threads= in the first call (or restart "
        "the process).",
        UserWarning, stacklevel=4,
    )


def _own_thread_pools(n, threads):
    """Gives each logical CPU device a compute thread pool of its own.

    By default TensorFlow runs the kernels of all CPU devices in one pool of
    `cores` threads, so N replicas' small kernels queue for the same threads
    and each kernel splits across all cores, so N replicas run slower than
    one device on the whole batch (measured in `docs/benchmarks.md`).
    `TF_OVERRIDE_GLOBAL_THREADPOOL` makes every device own a pool of the
    intra-op size, read when TensorFlow creates its devices.
    """
    if threads == 0:
        # Inherited from a parent process that split its own CPU.
        os.environ.pop("TF_OVERRIDE_GLOBAL_THREADPOOL", None)
        return
    os.environ["TF_OVERRIDE_GLOBAL_THREADPOOL"] = "1"
    program_set = (tf.config.threading.get_intra_op_parallelism_threads()
                   or os.environ.get("TF_NUM_INTRAOP_THREADS"))
    if threads is None and program_set:
        return  # the program's own size, now per device
    tf.config.threading.set_intra_op_parallelism_threads(
        int(threads or max(1, usable_cores() // n)))


# What `forward_bytes` leaves out: ops whose outputs are views of a buffer
# they receive or hold no batch data: they allocate nothing per row (or
# hold the weights, counted apart).
_NO_NEW_BUFFER = frozenset({
    "ReadVariableOp", "VarHandleOp", "Const", "Identity", "IdentityN",
    "Reshape", "ExpandDims", "Squeeze", "StopGradient", "NoOp",
    "Shape", "ShapeN", "Size", "Rank", "StridedSlice", "Pack",
})
# What the runtime is called in messages (`memory_plan`'s notes).
NAME = "TensorFlow"
# What a pass that does not fit in a device's memory raises.
OUT_OF_MEMORY = tf.errors.ResourceExhaustedError


def tensor_bytes(tensor):
    """Bytes of a graph tensor of fully known shape, else 0."""
    dtype = tensor.dtype
    if dtype in (tf.resource, tf.variant, tf.string) or not tensor.shape.is_fully_defined():
        return 0
    return int(np.prod(tensor.shape.as_list(), dtype=np.int64)) * dtype.size


def forward_bytes(model, specs):
    """Bytes of the tensors a training-mode forward pass of `model` produces.

    The pass is traced by `tf.function` (nothing runs) on inputs of the
    given shapes; every output of every op counts once, except the
    weights' reads and the ops that forward a buffer or describe shapes
    (`_NO_NEW_BUFFER`). The batch itself counts.

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
    specs = [tf.TensorSpec(shape, dtype) for shape, dtype in specs]

    def forward(*xs):
        return model(xs[0] if len(xs) == 1 else list(xs), training=True)

    graph = tf.function(forward).get_concrete_function(*specs).graph
    captured = {id(t) for t in graph.internal_captures}
    total = 0
    for op in graph.get_operations():
        if op.type in _NO_NEW_BUFFER:
            continue
        if op.type == "Placeholder" and any(id(t) in captured for t in op.outputs):
            continue
        total += sum(tensor_bytes(t) for t in op.outputs)
    return total


def memory_limit(device):
    """Bytes of a GPU's memory as TensorFlow's allocator limits it, or None.

    Example:
    >>> memory_limit("/device:GPU:0")
    15727656960
    """
    wanted = device.upper().replace("/DEVICE:", "")
    for name, limit in tensorflow_internals.device_memory_limits().items():
        if name.upper().replace("/DEVICE:", "") == wanted:
            return limit
    return None


def trial_pass(model, device, specs):
    """One forward and backward pass of zeros on `device`, run to the end.

    Args:
        model: A built Keras model.
        device: The device's name.
        specs: `(shape, dtype)` of each input, in order.

    Raises:
        OUT_OF_MEMORY: when the pass does not fit in the device's memory.

    Example:
    >>> trial_pass(model, "/device:GPU:0", [((512, 784), "float32")])
    """
    with tf.device(device):
        xs = [tf.zeros(shape, dtype) for shape, dtype in specs]
        with tf.GradientTape() as tape:
            outputs = model(xs[0] if len(xs) == 1 else xs, training=True)
            loss = tf.add_n([tf.reduce_mean(tf.cast(o, tf.float32))
                             for o in tf.nest.flatten(outputs)])
        gradients = tape.gradient(loss, model.trainable_variables)
        for gradient in gradients:
            if isinstance(gradient, tf.IndexedSlices):
                gradient = gradient.values
            if gradient is not None:
                gradient.numpy()


def wait(result):
    """`result` of a step: TensorFlow returns from a step once it ended.

    Example:
    >>> logs = wait(model.train_function(iterator))
    """
    return result


def process_agreement():
    """How the processes of a job agree on a flag without a strategy: never.

    Returns:
        None: on TensorFlow the workers agree through their
        `MultiWorkerMirroredStrategy` (`multigpu.cluster.agreement`).

    Example:
    >>> process_agreement() is None
    True
    """
    return None


def first_step(step, args, steps, strategy):
    """Runs a train function's first call, keeping the batches it draws.

    `ScalingMonitor` trains its one-device baseline on the first batch of
    `fit`: a `tf.data` or `tf.distribute` iterator's batches are drawn
    here (a strategy's parts joined), and the step runs on an iterator of
    the same kind over them. From an iterator of another kind nothing is
    kept.

    Args:
        step: The train function, called as `step(iterator)`.
        args: The arguments `fit` called it with, the iterator last.
        steps: The batches one call draws (`steps_per_execution`).
        strategy: The model's `distribute_strategy`, or None.

    Returns:
        `(logs, batch)`: the step's logs and its first batch as plain
        tensors, or None for the batch when none was kept.

    Raises:
        StopIteration: when the iterator has no batch left.

    Example:
    >>> logs, batch = first_step(model.train_function, (iterator,), 1,
    ...                          model.distribute_strategy)
    """
    iterator = args[-1]
    if not isinstance(iterator, (tf.data.Iterator,
                                 tf.distribute.DistributedIterator)):
        return step(iterator), None
    batches = []
    for _ in range(steps):
        try:
            batches.append(_local_batch(strategy, next(iterator)))
        except (StopIteration, tf.errors.OutOfRangeError):
            break
    if not batches:
        raise StopIteration
    return step(_same_kind(iterator, batches, strategy)), batches[0]


def _local_batch(strategy, data):
    """A batch drawn by `fit` as plain tensors (one strategy's parts joined)."""

    def joined(value):
        if isinstance(value, tf.distribute.DistributedValues):
            parts = strategy.experimental_local_results(value)
            return tf.concat(list(parts), axis=0)
        return value

    return tf.nest.map_structure(joined, data)


def _same_kind(iterator, batches, strategy):
    """An iterator like `fit`'s over the batches drawn from it."""
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    if isinstance(iterator, tf.distribute.DistributedIterator):
        return iter(strategy.experimental_distribute_dataset(dataset))
    return iter(dataset)


def holds_weights_in_step():
    """Whether Keras's trainer keeps the weights out of the model during `fit`.

    Returns:
        False: TensorFlow's steps update the model's variables in place, so
        a copy made inside a step starts from the current weights.

    Example:
    >>> holds_weights_in_step()
    False
    """
    return False


def sync_weights(model):
    """Puts the weights `fit` trains back into `model`: already there.

    Example:
    >>> sync_weights(model)
    """
    del model


def time_steps(copy, batch, steps):
    """Seconds of `steps` training steps of `copy` on `batch`, after one to trace.

    Each step runs `copy.train_function` as `fit` calls it, on an iterator
    that repeats the batch, and reads its logs back (so the step ended).

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
    copy.make_train_function()
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())

    def step():
        for value in keras.tree.flatten(copy.train_function(iterator)):
            value.numpy()

    return time_calls(step, steps)


def communication_free(devices):
    """Whether a step on `devices` moves no bytes between them.

    Args:
        devices: Canonical device names.

    Returns:
        True when all are logical CPU devices, between which TensorFlow
        passes references to one buffer.

    Example:
    >>> communication_free(["/device:CPU:0", "/device:CPU:1"])
    True
    """
    return all(":CPU:" in d.upper() for d in devices)


def where_communication_runs():
    """Where a step's communication runs, for `ScalingMonitor`'s notes.

    Example:
    >>> where_communication_runs()
    'Communication runs inside the compiled step on GPUs'
    """
    return "Communication runs inside the compiled step on GPUs"


def trial_by_default(devices):
    """Whether `find_batch_size` runs a trial pass when not told (`trial=None`).

    Args:
        devices: Canonical device names.

    Returns:
        True when all are GPUs: a pass there may run out of memory before
        the estimate says so (`trial_pass`).

    Example:
    >>> trial_by_default(["/device:GPU:0", "/device:GPU:1"])
    True
    """
    return all(":GPU:" in d.upper() for d in devices)
