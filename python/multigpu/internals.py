"""The Keras and TensorFlow internals this package relies on, in one place.

Each function reads or writes one private attribute, or imports one private
module (`keras.src...`, `tensorflow.python...`), for which Keras 3.15 and
TensorFlow 2.21 have no public equivalent. Everything else in the package
goes through these functions, so a Keras or TensorFlow upgrade that renames
one breaks this module only (ruff's SLF001 is off here and on everywhere
else; `tests/python/test_layout.py` refuses private imports elsewhere).
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


def producing_operation(tensor):
    """The layer or operation whose call made a symbolic Keras tensor.

    Example:
    >>> producing_operation(model.output).name
    'dense_1'
    """
    return tensor._keras_history.operation


def logits_of(tensor):
    """The logits Keras attached to a softmax or sigmoid output, or None.

    Keras's cross-entropy losses read them instead of the probabilities:
    exact and stable where log(clip(p)) is not.
    """
    return getattr(tensor, "_keras_logits", None)


def attach_logits(tensor, logits):
    """Attaches `logits` to `tensor`, as Keras's softmax and sigmoid do.

    Raises:
        AttributeError: for eager tensors, which take no attributes.
    """
    tensor._keras_logits = logits


def nodes_by_depth(graph):
    """A functional graph's nodes, `{depth: [node, ...]}` (outputs at 0)."""
    return graph._nodes_by_depth


def symbolic_build(model, data_batch):
    """Creates `model`'s compiled state (metrics, loss) from a batch's specs.

    What Keras's `fit` does before its first step.
    """
    model._symbolic_build(data_batch=data_batch)


def initial_epoch(model):
    """The epoch `BackupAndRestore` (or a resumed run) asks `fit` to start at."""
    return model._initial_epoch


def set_initial_epoch(model, epoch):
    """Asks `fit` to start at `epoch` (None: as given to `fit`)."""
    model._initial_epoch = epoch


def dataset_inputs(dataset):
    """The datasets a `tf.data.Dataset` reads from (none for a source).

    Raises:
        AttributeError, TypeError: for objects that are not datasets.
    """
    return dataset._inputs()


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


def functional_graph_of(model):
    """The functional graph Keras keeps inside a Sequential model, or None."""
    return getattr(model, "_functional", None)


def nested_layers(layer):
    """The layers inside `layer` (a nested model or layer), at any depth."""
    flatten = getattr(layer, "_flatten_layers", None)
    return list(flatten(include_self=False)) if flatten else []


def loss_tracker(model):
    """The `keras.metrics.Mean` that reports a compiled model's `loss`.

    Keras's `train_step` updates it; the engines' own step
    (`multigpu.step.train_step`) does the same.
    """
    return model._loss_tracker


def keras_mask(tensor):
    """The Keras mask a symbolic tensor carries (Embedding(mask_zero), ...)."""
    return getattr(tensor, "_keras_mask", None)


def takes_training_argument(operation):
    """Whether a layer's `call` takes Keras's `training` argument."""
    return "training" in getattr(operation, "_call_context_args", ())


def reshuffles_each_iteration(dataset):
    """Whether a `Dataset.shuffle` dataset draws a new order every epoch."""
    return bool(getattr(dataset, "_reshuffle_each_iteration", False))


def validates_for_fit(evaluate_arguments):
    """Whether an `evaluate` call is Keras's `fit` validating (by name).

    `fit` runs its validation as `evaluate(..., _use_cached_eval_dataset=True)`.
    """
    return bool(evaluate_arguments.get("_use_cached_eval_dataset"))


# The checkpoint callbacks' hook (`multigpu.checkpoints`): the random state
# Keras saves with no model.


def global_seed_generator():
    """The `keras.random.SeedGenerator` of unseeded `keras.random` calls, or None.

    Keras keeps it in its global state (created by the first unseeded draw)
    and saves it with no model; a resumed run restores its state.
    """
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("global_seed_generator")


# Placement's hook (`multigpu.placement.graphs`): run metadata, the executed
# partition graphs, is switched on and read through the eager context only.


def eager_context():
    """TensorFlow's eager context (its run-metadata switches and export)."""
    return context.context()


# The engines' hooks: the copy of an in-memory model (`multigpu.engines.copies`) and
# the memory plan (`multigpu.insight.memory_plan`).


def is_functional(model):
    """Whether `model` is Keras's functional model (its class is private).

    A subclassed model called on symbolic inputs has `inputs` too, but no
    graph of layers: its `call` is code.
    """
    from keras.src.models.functional import Functional

    return isinstance(model, Functional)


def device_memory_limits():
    """`{device name: bytes}` of the allocators' limits, for GPUs.

    `tensorflow.python.client.device_lib` is the only place TensorFlow
    gives a GPU's memory limit; CPUs report none.
    """
    from tensorflow.python.client import device_lib

    return {local.name: int(local.memory_limit)
            for local in device_lib.list_local_devices()
            if local.memory_limit and local.device_type == "GPU"}


def batch_norm_reduction_axes(layer):
    """The axes a built BatchNormalization layer takes its moments over."""
    return list(layer._reduction_axes)


def replace_moments(layer, moments):
    """Makes a BatchNormalization layer take its moments from `moments`.

    `moments(inputs, mask)` returns `(mean, variance)` as the layer's own
    `_moments` does; the layer's `call` still normalises and updates its
    moving statistics with them.
    """
    layer._moments = moments


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


# The guarded step's stateless forward pass (`multigpu.step.stateless`).


def stateless_scope():
    """The `keras.StatelessScope` being traced in (Keras keeps it per thread)."""
    from keras.src.backend.common import stateless_scope

    return stateless_scope.get_stateless_scope()


def stored_value(variable):
    """A Keras variable's value as stored: no stateless scope, no autocast."""
    return tf.convert_to_tensor(variable._value)


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


# A failed `fit`'s input iterators (`multigpu.engines.template.TemplateBacked.fit`).


def release_iterator(iterator):
    """Frees the tf.data iterators inside a `fit`'s input iterator now.

    When `fit` raises, Keras's epoch iterator stays in a reference cycle
    (its suspended generator refers back to it) and in the frames of the
    error, and with it the iterator it passed to the train function: a
    `tf.distribute` `DistributedIterator` (its workers' multi-device
    iterator and one iterator per device) or a `tf.data` iterator. Freed
    later by a garbage collection, an aged tf.data iterator can wait up to
    a minute for its autotuning thread (docs/tf-data-stall.md). The Python objects
    stay where they are, emptied: they are never iterated again.

    Args:
        iterator: What Keras passed to `model.train_function`.
    """
    workers = getattr(iterator, "_iterators", None)
    if isinstance(workers, list):  # tf.distribute's DistributedIterator
        for worker in workers:
            _release_owned(getattr(worker, "_iterator", None))
            worker._iterator = None
        iterator._iterators = []
    else:
        _release_owned(iterator)


def _release_owned(iterator):
    devices = getattr(iterator, "_device_iterators", None)
    if isinstance(devices, list):  # OwnedMultiDeviceIterator
        for device_iterator in devices:
            _release_owned(device_iterator)
        iterator._device_iterators = []
        iterator._multi_device_iterator_resource = None
    elif hasattr(iterator, "_iterator_resource"):  # tf.data's OwnedIterator
        iterator._iterator_resource = None


def drop_cached_evaluation(model):
    """Frees the validation iterator a failed `fit` left on `model`.

    Keras's `fit` caches its validation data's epoch iterator on the model
    and deletes it only when it returns; the next `fit` would free it.
    """
    if getattr(model, "_eval_epoch_iterator", None) is not None:
        model._eval_epoch_iterator = None


def initialized(variable):
    """Whether a Keras variable holds a value.

    A variable created inside a stateless scope gets its value only when
    the scope ends.
    """
    return variable._value is not None


# Attributes kept out of Keras's and TensorFlow's tracking: one mechanism
# for every engine (`multigpu.engines`).


@tf.__internal__.tracking.no_automatic_dependency_tracking
def _assign_without_dependency(obj, name, value):
    setattr(obj, name, value)


def set_untracked(obj, name, value):
    """Sets `obj.<name>` to `value` out of sight of Keras's and TensorFlow's tracking.

    A Keras layer or model tracks what its attributes are set to: a layer
    becomes one of its layers, a variable one of its weights, a list a
    tracked list. Keras 3.15 switches that off in the private
    `keras.src.utils.tracking.DotNotTrackScope`. On TensorFlow a trackable
    also becomes a checkpoint dependency of the model, which TensorFlow
    2.21 switches off per object with
    `tf.__internal__.tracking.no_automatic_dependency_tracking`. An
    attribute set here is neither: use it for a reference to another
    model (a template) and for state that is not the model's (a gradient
    accumulator's or the NaN guard's variables). Other objects take the
    value as any attribute.

    Args:
        obj: A Keras layer or model, or any object.
        name: The attribute's name.
        value: Its value.

    Returns:
        `value`.

    Example:
    >>> set_untracked(model, "_template", template)
    >>> template in model.layers
    False
    """
    from keras.src.utils import tracking

    with tracking.DotNotTrackScope():
        if isinstance(obj, tf.__internal__.tracking.Trackable):
            _assign_without_dependency(obj, name, value)
        else:
            setattr(obj, name, value)
    return value


def untracked(obj, name, make=None):
    """`obj`'s attribute `name`, as `set_untracked` set it.

    Args:
        obj: The object.
        name: The attribute's name.
        make: Called when `obj` has no such attribute yet; its result is
            set with `set_untracked` and returned. Without it the answer
            is then None.

    Returns:
        The attribute's value, or what `make()` made, or None.

    Example:
    >>> untracked(model, "_parts", make=lambda: [keras.Variable(0.0)])
    [<Variable ...>]
    """
    try:
        return getattr(obj, name)
    except AttributeError:
        return None if make is None else set_untracked(obj, name, make())


# The mirrored engine's hooks (`multigpu.engines.tensorflow.mirrored`).


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


def metrics_in_order(model, logs):
    """`logs` as a `*_on_batch` call returns them without `return_dict`.

    One value, or a list in the order of the model's metrics (the rest by
    name): what Keras 3.15's `train_on_batch` returns, through the private
    `Trainer._flatten_metrics_in_order`.

    Args:
        model: The compiled model the logs are of.
        logs: `{name: value}` of one step.

    Returns:
        A scalar or a list of scalars.
    """
    return model._flatten_metrics_in_order(logs)


# The strategies' hook (`multigpu.distribute.strategy`).


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


# The optimizer's update, run once in cross-replica context
# (`multigpu.step.train_step.apply_once`).


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


# Saving's hook (`multigpu.saving`).


def optimizer_weights_from_hdf5(h5):
    """The optimizer's weights a legacy `.h5` model file holds, in order.

    Keras 3.15 reads them only in its private legacy loader
    (`keras.src.legacy.saving.legacy_h5_format`); no public function
    returns them.

    Args:
        h5: An open `h5py.File` with an `optimizer_weights` group.

    Returns:
        A list of numpy arrays, for `optimizer.set_weights`.
    """
    from keras.src.legacy.saving import legacy_h5_format

    return legacy_h5_format.load_optimizer_weights_from_hdf5_group(h5)


# The cluster resolver's hooks (`multigpu.cluster.resolver`): TensorFlow
# 2.21 exports `tf.distribute.cluster_resolver.SlurmClusterResolver` but not
# the parsers it reads Slurm's variables with
# (`tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver`).


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


# Placement's hooks (`multigpu.placement.communication`, `.profiler`).


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


# The order of the parts of Keras's JAX trainer state (`_get_jax_state`).
_JAX_STATE_PARTS = ("trainable_variables", "non_trainable_variables",
                    "optimizer_variables", "metrics_variables")


def hold_jax_state(model, state):
    """Makes `state` the JAX trainer's latest state, synced back at `fit`'s end.

    Keras's JAX `fit` takes the variables' values out of the model at each
    epoch's start and puts the latest state back when it ends, but a call
    of the train function that fails before any step of the epoch leaves
    no state to put back: the model's variables would stay empty.

    Args:
        model: A `keras.Model` on JAX, inside `fit`.
        state: The `(trainable, non_trainable, optimizer, metrics)` values
            the train function was given.
    """
    model._jax_state = dict(zip(_JAX_STATE_PARTS, state))
    model._jax_state_synced = False


def set_variable_layout(variable, layout):
    """Gives a Keras variable on JAX a layout, and moves its value there.

    Keras reads a variable's layout (`_layout`) when it creates it, in a
    distribution's scope, and every later assignment puts the value where
    the layout says; it has no public way to give an existing variable
    one. `model_parallel` on JAX (`multigpu.partition.jax_sharding`) needs
    one for variables made outside its scope (an optimizer or a metric made
    before `compile`), which would otherwise stay on one device.

    Args:
        variable: A `keras.Variable` on the JAX backend.
        layout: A `keras.distribution.TensorLayout` (or a
            `jax.sharding.Sharding`).

    Example:
    >>> set_variable_layout(optimizer.iterations, replicated_layout)
    """
    variable._layout = layout
    variable.assign(variable.value)
