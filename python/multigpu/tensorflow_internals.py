"""The TensorFlow internals this package relies on, in one place.

Each function reads or writes one private attribute, or imports one private
module (`tensorflow.python...`), for which TensorFlow 2.21 (and Keras 3.15's
TensorFlow backend) has no public equivalent. Only the modules that run
TensorFlow import this one; Keras's own internals, which every backend
needs, are in `multigpu.internals`. A TensorFlow upgrade that renames one
breaks this module only (ruff's SLF001 is off here and in `internals`;
`tests/python/test_layout.py` refuses private imports elsewhere).
"""

import contextlib
import dataclasses
import threading

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.eager import context
from tensorflow.python.framework import ops as ops_lib


@dataclasses.dataclass
class InternalsState:
    """What this module keeps for the process.

    Attributes:
        restarted: Whether `restart_tensorflow` ran: CUDA, started with the
            first runtime, keeps the GPUs it saw then (it reads
            `CUDA_VISIBLE_DEVICES` once).
        op_callback_users: Open `op_callback` blocks per (callback list,
            callback) pair.
        op_callback_lock: Guards `op_callback_users` (replica threads
            enter and leave blocks concurrently).
    """

    restarted: bool = False
    op_callback_users: dict = dataclasses.field(default_factory=dict)
    op_callback_lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock)

    def reset(self):
        """Forgets a restart (for tests that simulate a fresh process).

        The op callbacks' users are left alone: each open block removes
        its own when it ends.
        """
        self.restarted = False


STATE = InternalsState()


def registered_gradient_names():
    """Names in TensorFlow's process-wide gradient registry."""
    return set(ops_lib._gradient_registry.list())


def move_gradient_to_op(op, name):
    """Moves the registered gradient function `name` onto `op`.

    `tf.gradients` consults an operation's own gradient function before the
    registry; the registry entry, which would keep the traced graph alive
    for the rest of the process, is removed.
    """
    registry = ops_lib._gradient_registry
    op._gradient_function = registry.lookup(name)
    del registry._registry[name]


def tensorflow_started():
    """Whether TensorFlow's runtime (and so CUDA) has been initialised."""
    return context.context()._context_handle is not None


def cuda_may_have_started():
    """Whether TensorFlow's runtime has started in this process, even if restarted since."""
    return STATE.restarted or tensorflow_started()


def eager_tensor_type():
    """The class of the concrete tensors of TensorFlow's eager context."""
    return ops_lib.EagerTensor


def restart_tensorflow():
    """Discards TensorFlow's eager context, so its devices can be configured again.

    TensorFlow's own tests do this between cases. Tensors and variables of
    the old context must no longer exist: the caller checks that none lives.
    """
    context._reset_context()
    STATE.restarted = True


def eager_context():
    """TensorFlow's eager context (its run-metadata switches and export)."""
    return context.context()


def device_memory_limits():
    """`{device name: bytes}` of the allocators' limits, for GPUs.

    `tensorflow.python.client.device_lib` is the only place TensorFlow
    gives a GPU's memory limit; CPUs report none.
    """
    from tensorflow.python.client import device_lib

    return {local.name: int(local.memory_limit)
            for local in device_lib.list_local_devices()
            if local.memory_limit and local.device_type == "GPU"}


def run_branch_as_function(cond_output):
    """Keeps the `If` op of a `tf.cond` from being lowered to Switch/Merge.

    A lowered conditional runs every node of the branch it does not take
    (as dead tensors) and a Switch per captured input, on every step; an
    `If` op left as it is runs one branch function. TensorFlow lowers an
    `If` when its private `_lower_using_switch_merge` attribute is True,
    which `tf.cond` sets in a `tf.function`.

    Args:
        cond_output: A tensor that `tf.cond` returned (inside a graph).

    Returns:
        `cond_output`.
    """
    op = cond_output.op
    while op.type not in ("If", "StatelessIf"):
        op = op.inputs[0].op
    op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))
    return cond_output


@contextlib.contextmanager
def op_callback(callback):
    """Calls `callback` for each TensorFlow op created in the block.

    TensorFlow's op callbacks (`tf.debugging.enable_check_numerics` is
    built on them) are kept per thread, but a `MirroredStrategy`'s replica
    threads share the list of the thread that started them, and leave a
    block in any order: the callback stays registered until the last block
    using it on that list ends.

    Args:
        callback: `callback(op_type, inputs, attrs, outputs, op_name=None,
            graph=None)`, returning the outputs to use from then on (those
            it was given, or replacements).
    """
    from tensorflow.python.framework import op_callbacks

    key = (id(context.context().op_callbacks), callback)
    users = STATE.op_callback_users
    with STATE.op_callback_lock:
        if key not in users:
            op_callbacks.add_op_callback(callback)
        users[key] = users.get(key, 0) + 1
    try:
        yield
    finally:
        with STATE.op_callback_lock:
            users[key] -= 1
            if not users[key]:
                del users[key]
                op_callbacks.remove_op_callback(callback)


@tf.__internal__.tracking.no_automatic_dependency_tracking
def _assign_without_dependency(obj, name, value):
    setattr(obj, name, value)


def set_without_dependency(obj, name, value):
    """Sets `obj.<name>` without making `value` a checkpoint dependency.

    The TensorFlow part of `multigpu.internals.set_untracked`: TensorFlow
    2.21 switches dependency tracking off per object with
    `tf.__internal__.tracking.no_automatic_dependency_tracking`.

    Args:
        obj: Any object.
        name: The attribute's name.
        value: Its value.

    Returns:
        Whether `obj` is a TensorFlow trackable, and so was set here.
    """
    if not isinstance(obj, tf.__internal__.tracking.Trackable):
        return False
    _assign_without_dependency(obj, name, value)
    return True


class BuildsFromOneReplica:
    """Mixin of a `keras.Model` under a strategy: built from one replica's share.

    Under a strategy, Keras 3.15's TensorFlow trainer builds a model's
    compiled state (metrics, loss) before the first step of `fit` and
    `evaluate` from their first batch, averaged over the replicas
    (`TensorFlowTrainer._maybe_symbolic_build` in Keras's
    `keras/src/backend/tensorflow/trainer.py`, given the epoch iterator,
    whose steps are `(begin, end, iterator)`).
    The average fails ("AddN ... must have the same size and shape")
    unless the batch splits evenly; the first replica's share has the
    shapes the build needs. The batch of a `*_on_batch` step is used as
    it comes. Place the mixin before `keras.Model` in the bases.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = keras.tree.map_structure(
                    self._first_replica_value, next(batches))
                break
        return super()._maybe_symbolic_build(data_batch=data_batch)

    def _first_replica_value(self, value):
        if isinstance(value, tf.distribute.DistributedValues):
            return self.distribute_strategy.experimental_local_results(value)[0]
        return value


def set_collective_key_base(strategy, base):
    """Makes a `MirroredStrategy` number its collective groups from `base`.

    TensorFlow 2.21's `MirroredExtended` reads the strategy's private
    `_collective_key_base` while the strategy is constructed (TensorFlow's
    own tests raise it per strategy): call this before
    `tf.distribute.MirroredStrategy.__init__`.

    Args:
        strategy: A `tf.distribute.MirroredStrategy` being constructed.
        base: An int, above the keys of every other strategy's groups.
    """
    strategy._collective_key_base = base


_INTERIM_LOCK = threading.Lock()


def run_cross_replica_merge_calls_inline():
    """Lets Keras's TensorFlow optimizer update from cross-replica context.

    Keras 3.15's optimizer reaches cross-replica context through
    `tf.__internal__.distribute.interim.maybe_merge_call`, which on
    `MirroredStrategy` over CPUs (or without XLA) calls
    `get_replica_context().merge_call(fn)`. Called in cross-replica context,
    where there is no replica context, that raises an AttributeError on
    None. Once this ran, such a call runs `fn(strategy, ...)` itself, which
    is what the `merge_call` of a replica would have run; calls from a
    replica are unchanged. Installed once per process (idempotent).
    """
    interim = tf.__internal__.distribute.interim
    with _INTERIM_LOCK:
        original = interim.maybe_merge_call
        if getattr(original, "runs_cross_replica_inline", False):
            return

        def maybe_merge_call(fn, strategy, *args, **kwargs):
            if tf.distribute.in_cross_replica_context():
                return fn(strategy, *args, **kwargs)
            return original(fn, strategy, *args, **kwargs)

        maybe_merge_call.runs_cross_replica_inline = True
        interim.maybe_merge_call = maybe_merge_call


def apply_loss_scaled(optimizer, grads, variables):
    """A `LossScaleOptimizer`'s update from cross-replica context.

    Keras's `LossScaleOptimizer.apply` on TensorFlow refuses cross-replica
    context; its backend-neutral update (`_common_apply`: skip the step and
    halve the scale when a gradient is not finite, else update and count
    toward doubling it) is the one every other backend runs.

    Args:
        optimizer: A `keras.optimizers.LossScaleOptimizer`.
        grads: The gradients of the whole batch (scaled by the loss scale).
        variables: The variables they are for.
    """
    if not optimizer.built:
        optimizer.build(variables)
    optimizer._common_apply(grads, variables)


def slurm_hostlist(nodelist):
    """The host names of a Slurm node list, in order.

    Example:
    >>> slurm_hostlist("n[1-2],m5")
    ['n1', 'n2', 'm5']
    """
    from tensorflow.python.distribute.cluster_resolver import (
        slurm_cluster_resolver,
    )

    return slurm_cluster_resolver.expand_hostlist(nodelist)


def slurm_tasks_per_node(tasks):
    """Slurm's tasks per node (`SLURM_STEP_TASKS_PER_NODE`), one int per node.

    Example:
    >>> slurm_tasks_per_node("3(x2),1")
    [3, 3, 1]
    """
    from tensorflow.python.distribute.cluster_resolver import (
        slurm_cluster_resolver,
    )

    return slurm_cluster_resolver.expand_tasks_per_node(tasks)


def nvidia_smi_gpu_count():
    """The GPUs `nvidia-smi` lists on this node, as `SlurmClusterResolver` counts them.

    Raises:
        RuntimeError, OSError: when `nvidia-smi` fails.
    """
    from tensorflow.python.distribute.cluster_resolver import (
        slurm_cluster_resolver,
    )

    return slurm_cluster_resolver.get_num_gpus()


def recorded_graph_tensors(dump_root):
    """What a debugger dump recorded of graph tensors: `[(op, slot, value)]`.

    TensorFlow 2.21's `tf.debugging.experimental.enable_dump_debug_info`
    writes the dump; its reader (`DebugDataReader`) is in the private
    `tensorflow.python.debug.lib.debug_events_reader` only.

    Args:
        dump_root: The directory the dump was written to.

    Returns:
        One `(op name, output slot, value as a numpy array)` per recorded
        execution of a graph op's output, in execution order. With
        `tensor_debug_mode="SHAPE"` the value is TensorFlow's shape summary
        (`[id, dtype enum, rank, size, dim 0, ... dim 5]`).
    """
    from tensorflow.python.debug.lib import debug_events_reader

    recorded = []
    with debug_events_reader.DebugDataReader(dump_root) as reader:
        reader.update()
        for trace in reader.graph_execution_traces():
            recorded.append((trace.op_name, trace.output_slot, np.asarray(
                reader.graph_execution_trace_to_tensor_value(trace))))
    return recorded


def profiler_space(path):
    """A profiler trace file (`*.xplane.pb`), parsed: an `XSpace` message.

    TensorFlow 2.21's profiler (`tf.profiler.experimental`) writes it; the
    message class is in `tensorflow.tsl.profiler.protobuf.xplane_pb2` only.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as handle:
        space.ParseFromString(handle.read())
    return space

