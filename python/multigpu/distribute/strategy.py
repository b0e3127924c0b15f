"""Strategy-scoped training: `tf.distribute` strategies that are safe to reuse.

`mirrored_strategy` returns a `tf.distribute.MirroredStrategy` over the devices
`multi_gpu_model(gpus=...)` would use (one resolver: `devices.resolve_devices`).
Two problems of plain `tf.distribute.MirroredStrategy` are fixed here:

* Collective keys. Every `MirroredStrategy` numbers its collective groups from
  1, and the collective runtime is process-wide: a second strategy over other
  devices reuses group key 1 with another device set, and its first `fit`
  aborts every collective of the process ("joining a group with size 4, but
  that group has size 2 (group_key=1)"). TensorFlow's own tests avoid this by
  raising `_collective_key_base` per strategy; each strategy made here gets a
  key range of its own, starting far above the keys of strategies users make
  directly.
* Reuse. Strategies are cached per (device set, cross-device ops), so asking
  again for the same devices returns the same strategy, whose collective
  instance keys keep counting instead of starting over.

The strategies also turn the classic errors of strategy code into messages
that say what went wrong and how to fix it (see `StrategyUsageError`).

`multi_worker_strategy` is the multi-machine counterpart: a
`tf.distribute.MultiWorkerMirroredStrategy` over the cluster the cluster
manager describes (`TF_CONFIG` or a Slurm job step; see `multigpu.cluster.resolver`).
"""

import dataclasses
import itertools
import threading

import tensorflow as tf

from multigpu import backends, tensorflow_internals
from multigpu import devices as devices_lib
from multigpu.cluster import resolver as cluster_lib
from multigpu.cluster.readiness import signal_ready
from multigpu.messages import api, literal, literals, setting
from multigpu.runtime import tensorflow as tensorflow_runtime

# What the strategies need of TensorFlow (`backends.require_backend`).
TF_DISTRIBUTE = backends.TF_DISTRIBUTE

# Strategies made here number their collective groups from
# `_KEY_BASE_START + k * _KEY_STRIDE`: far above the keys of strategies made
# directly with tf.distribute (which start at 1), and a stride that one
# strategy's groups (one per distinct device set it reduces over) never fill.
_KEY_BASE_START = 1_000_000
_KEY_STRIDE = 10_000


@dataclasses.dataclass
class StrategiesState:
    """The strategies made in this process.

    Attributes:
        lock: Guards the rest (strategies are asked for from any thread).
        key_bases: Counts the collective key ranges handed out.
        mirrored: `{(devices, cross-device ops key): (strategy, ops)}`.
        multi_worker: The multi-worker strategy, once made (TensorFlow
            allows one per process).
    """

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    key_bases: itertools.count = dataclasses.field(
        default_factory=itertools.count)
    mirrored: dict = dataclasses.field(default_factory=dict)
    multi_worker: tf.distribute.Strategy | None = None

    def reset(self):
        """Forgets the strategies made (for tests).

        The key ranges keep counting: the collective runtime is
        process-wide, and a new strategy must not reuse the groups of one
        forgotten here.
        """
        with self.lock:
            self.mirrored.clear()
            self.multi_worker = None


STATE = StrategiesState()

_CROSS_DEVICE_OPS = {
    "nccl": lambda: tf.distribute.NcclAllReduce(),
    "hierarchical_copy": lambda: tf.distribute.HierarchicalCopyAllReduce(),
    "reduce_to_one": lambda: tf.distribute.ReductionToOneDevice(),
}


class StrategyUsageError(ValueError):
    """A strategy was used in a way that cannot work; the message says why.

    Raised in place of TensorFlow's own error (kept as `__cause__`) for the
    classic mistakes of strategy code.
    """


_OUTSIDE_SCOPE = (
    "Training inside `strategy.scope()` failed because some variables are "
    "ordinary variables instead of mirrored ones: the model (or its "
    "optimizer) was created outside the strategy's scope and trained inside "
    "it. {reported} Fix: create "
    "the model AND compile it inside `with strategy.scope():` (the model's "
    "build function, `keras.models.load_model` and `compile` all belong "
    "there); or keep the model you have and call "
    "{mirror_call}, which mirrors a copy "
    "of a model built anywhere."
)
_REPLICA_CONTEXT = (
    "A mirrored variable was read outside a replica context ({original}). "
    "This happens when a training step that calls the model and "
    "`optimizer.apply_gradients` runs directly under `strategy.scope()` "
    "instead of through `strategy.run`. Fix: use `model.fit(...)`; or, in a "
    "custom loop, distribute the data with "
    "`strategy.experimental_distribute_dataset(dataset)` and run the step "
    "with `strategy.run(step, args=(batch,))` inside a `tf.function`; or use "
    "{fit_call}, which does exactly that."
)
_FOREIGN_OPTIMIZER = (
    "The optimizer was already built for another model's variables "
    "({original}). An optimizer serves one model, and under a strategy it "
    "must also be built under the strategy's scope. Fix: create a new "
    "optimizer (or pass its name, e.g. {optimizer_setting}) when you compile the "
    "model inside `with strategy.scope():`."
)


_MIXED = (
    "Two tf.distribute strategies were mixed ({original}). A model's "
    "variables, its optimizer and the scope open while it is compiled and "
    "trained must all belong to one strategy. This happens when a model "
    "built under one strategy's scope is compiled or trained under "
    "another's; when its optimizer was created under another strategy's "
    "scope; or when one strategy's scope is opened inside another's (a "
    "model from {mirrored_call} opens its own strategy's scope in compile() "
    "and fit(): call them outside any other). Fix: create, compile and "
    "train the model under the scope of the one strategy you train with "
    "({strategy_call} returns the same strategy for the same devices); to "
    "train a model on other devices, build it outside any strategy scope "
    "and pass it to {spread_call}."
)
_SPREAD_IN_SCOPE = (
    "{call} was called inside `strategy.scope()` of a {strategy}, but the "
    "model it returns spreads its work over its devices itself: under a "
    "tf.distribute strategy its training step fails (TensorFlow reports "
    "`merge_call` called while defining a new graph, or that strategies "
    "were mixed). Fix: call {call}, and the returned model's compile(), "
    "fit(), evaluate() and predict(), outside any `with strategy.scope():` "
    "block."
)
_MIRRORED_TEMPLATE = (
    "Invalid `model`: {name} was built inside `strategy.scope()` (its "
    "variables, e.g. {paths}, are mirrored by a {strategy}), but {call} "
    "spreads a model over devices itself and cannot take variables that a "
    "strategy mirrors: training would fail in fit(). Fix: build the model "
    "outside any strategy scope and pass that to {call}; or train this "
    "model with its strategy (model.fit under the strategy, or {fit_call}) "
    "without {call}."
)
_METHOD_IN_SCOPE = (
    "{method}() was called inside `strategy.scope()` of a {strategy}, but "
    "{name} {own}, and under {other} its training step fails. Fix: call "
    "{method}() outside the `with strategy.scope():` block."
)


_UNEVEN = (
    "Cannot average per-replica values of different shapes {shapes}: a "
    "batch that does not split evenly between the {n} replicas. Keras's "
    "model.fit under a MirroredStrategy builds the model from its first "
    "batch this way and fails on such a batch. Fix: use a batch size that is "
    "a multiple of {n} (strategy.num_replicas_in_sync); or make the data "
    "with {dataset_call}, "
    "which batches at a multiple of the replica count; "
    "or train with {parallel_call}, which takes "
    "any batch size."
)


def _local_shapes(strategy, value):
    first = tf.nest.flatten(value)[0]
    try:
        return [tuple(v.shape) for v in
                strategy.experimental_local_results(first)]
    except (AttributeError, TypeError, ValueError):
        return "(unknown)"


def _frame_names(traceback):
    names = []
    while traceback is not None:
        names.append(traceback.tb_frame.f_code.co_name)
        traceback = traceback.tb_next
    return names


def _line_with(message, text):
    """The line of `message` holding `text`, stripped."""
    return next(line.strip() for line in message.splitlines() if text in line)


def _strategy_name(strategy):
    return type(strategy).__name__


def check_outside_strategies(call, model=None):
    """Refuses to spread a model over devices under a strategy, or one it mirrors.

    `multi_gpu_model` and `model_parallel` place the work of the model they
    return on its devices themselves. Made inside a strategy's scope, the
    model records that strategy and its training step fails in `fit`
    (`merge_call called while defining a new graph`); a template whose
    variables a strategy mirrors fails there too.

    Args:
        call: The function's name, e.g. `"multi_gpu_model"`.
        model: The template, whose variables must not be mirrored; None to
            check the open scope only.

    Raises:
        StrategyUsageError: naming the strategy and the fix.
    """
    if tf.distribute.has_strategy():
        raise StrategyUsageError(_SPREAD_IN_SCOPE.format(
            call=api(call), strategy=_strategy_name(tf.distribute.get_strategy())))
    if model is None:
        return
    mirrored = [(v.path, v.value) for v in model.weights
                if isinstance(v.value, tf.distribute.DistributedValues)]
    if mirrored:
        raise StrategyUsageError(_MIRRORED_TEMPLATE.format(
            name=literal(model.name), paths=literals([p for p, _ in mirrored[:2]], "and"),
            strategy=_strategy_name(mirrored[0][1].distribute_strategy),
            call=api(call), fit_call=api("fit_distributed", "model, dataset")))


def check_own_scope(model, method):
    """Refuses `model.<method>()` inside the scope of a strategy not its own.

    Args:
        model: A model of this package; the mirrored engine's has its own
            strategy (`model.strategy`), the others none.
        method: The method's name, for the message.

    Raises:
        StrategyUsageError: if another strategy's scope is open.
    """
    if not tf.distribute.has_strategy():
        return
    current = tf.distribute.get_strategy()
    own = getattr(model, "strategy", None)
    if current is own:
        return
    raise StrategyUsageError(_METHOD_IN_SCOPE.format(
        method=method, strategy=_strategy_name(current),
        name=literal(model.name),
        own="spreads its work over its devices itself, without a "
        "tf.distribute strategy" if own is None
        else f"trains under a strategy of its own, {own!r}",
        other="a strategy" if own is None else "another"))


def explain_error(error):
    """Returns a `StrategyUsageError` explaining `error`, or None.

    Recognises the failures users hit when the strategy's scope is used
    wrongly: variables created outside the scope and updated inside it (a
    bare AssertionError, or `colocate_vars_with` refusing them), a mirrored
    variable used outside a replica context, an optimizer built for other
    variables, and two strategies mixed (a model, its optimizer or an open
    scope of another strategy).

    Args:
        error: An exception raised while running code under a strategy.

    Returns:
        A `StrategyUsageError` whose message names the cause and the fix, or
        None when `error` is not one of those failures.
    """
    if isinstance(error, StrategyUsageError):
        return None
    message = str(error)
    mirror_call = api("multi_gpu_model", "model, " + setting("engine", "mirrored"))
    if isinstance(error, AssertionError) and not message.strip() and any(
        "update" in name for name in _frame_names(error.__traceback__)
    ):
        return StrategyUsageError(_OUTSIDE_SCOPE.format(
            reported="TensorFlow only reports a bare AssertionError for this.",
            mirror_call=mirror_call))
    first_line = message.strip().splitlines()[-1] if message.strip() else ""
    if isinstance(error, ValueError) and "`colocate_vars_with` must only" in message:
        return StrategyUsageError(_OUTSIDE_SCOPE.format(
            reported=f"TensorFlow reports: {_line_with(message, 'colocate_vars_with')}",
            mirror_call=mirror_call))
    if isinstance(error, RuntimeError) and "Mixing different tf.distribute" in message:
        return StrategyUsageError(_MIXED.format(
            original=_line_with(message, "Mixing different"),
            mirrored_call=mirror_call,
            strategy_call=api("mirrored_strategy", "devices"),
            spread_call=api("multi_gpu_model", "model, gpus")))
    if "handle is not available outside the replica context" in message:
        return StrategyUsageError(_REPLICA_CONTEXT.format(original=first_line, fit_call=api("fit_distributed", "model, dataset")))
    if isinstance(error, ValueError) and "Unknown variable" in message and (
        "optimizer" in message
    ):
        original = message.split(". ")[0]
        return StrategyUsageError(_FOREIGN_OPTIMIZER.format(original=original, optimizer_setting=setting("optimizer", "adam")))
    return None


class _ExplainingScope:
    """Wraps a strategy's scope; re-raises known failures with a fix."""

    def __init__(self, scope):
        self._scope = scope

    def __enter__(self):
        try:
            return self._scope.__enter__()
        except Exception as error:
            explained = explain_error(error)
            if explained is None:
                raise
            raise explained from error

    def __exit__(self, error_type, error, traceback):
        suppressed = self._scope.__exit__(error_type, error, traceback)
        if error is not None and not suppressed:
            explained = explain_error(error)
            if explained is not None:
                raise explained from error
        return suppressed


class ExplainingMirroredStrategy(tf.distribute.MirroredStrategy):
    """A `tf.distribute.MirroredStrategy` that explains the mistakes made with it.

    Its `scope()`, `run()` and `reduce()` re-raise the classic mistakes of
    strategy code as a `StrategyUsageError` with the fix (see
    `explain_error`); it has its own collective-key range, so strategies
    over different devices train in one process. Made by
    `mirrored_strategy`; use that instead of the constructor.

    Args:
        devices: Canonical device names, one replica per device.
        cross_device_ops: None or a `tf.distribute.CrossDeviceOps`.
        collective_key_base: Offset of this strategy's collective group keys.
    """

    def __init__(self, devices, cross_device_ops=None, collective_key_base=0):
        tensorflow_internals.set_collective_key_base(self, collective_key_base)
        self._device_names = tuple(devices)
        super().__init__(devices=devices, cross_device_ops=cross_device_ops)

    def __repr__(self):
        # TensorFlow's "Mixing different tf.distribute.Strategy objects: A
        # is not B" then says which strategies were mixed.
        return f"{type(self).__name__}(devices={list(self._device_names)})"

    def scope(self):
        return _ExplainingScope(super().scope())

    def reduce(self, reduce_op, value, axis):
        try:
            return super().reduce(reduce_op, value, axis)
        except tf.errors.InvalidArgumentError as error:
            if axis is not None or "same size and shape" not in str(error):
                raise
            raise StrategyUsageError(_UNEVEN.format(
                shapes=_local_shapes(self, value),
                n=self.num_replicas_in_sync,
                dataset_call=api("distributed_dataset", "x, y, per_replica_batch_size, strategy"),
                parallel_call=api("multi_gpu_model", "model"),
            )) from error

    def run(self, fn, args=(), kwargs=None, options=None):
        try:
            return super().run(fn, args=args, kwargs=kwargs, options=options)
        except Exception as error:
            explained = explain_error(error)
            if explained is None:
                raise
            raise explained from error


def _cross_device_ops(cross_device_ops):
    """Validates `cross_device_ops`; returns (cache key, ops object)."""
    if cross_device_ops is None:
        return None, None
    if isinstance(cross_device_ops, str):
        make = _CROSS_DEVICE_OPS.get(cross_device_ops)
        if make is None:
            raise ValueError(
                f"Invalid `cross_device_ops`: received {literal(cross_device_ops)}; "
                f"expected {literal(None)} (collective all-reduce), one of "
                f"{literals(sorted(_CROSS_DEVICE_OPS))}, or a "
                "tf.distribute.CrossDeviceOps instance."
            )
        return cross_device_ops, make()
    if isinstance(cross_device_ops, tf.distribute.CrossDeviceOps):
        return id(cross_device_ops), cross_device_ops
    received = (literal(cross_device_ops)
                if isinstance(cross_device_ops, (bool, int, float, list, tuple))
                else f"an object of type {type(cross_device_ops).__name__}")
    raise TypeError(
        f"Invalid `cross_device_ops`: received {received}; expected "
        f"{literal(None)} (collective all-reduce), one of "
        f"{literals(sorted(_CROSS_DEVICE_OPS))}, or a "
        "tf.distribute.CrossDeviceOps instance."
    )


def mirrored_strategy(devices=None, cross_device_ops=None):
    """A `tf.distribute.MirroredStrategy` over the devices `gpus=` would use.

    `devices` is resolved exactly like `multi_gpu_model(gpus=...)`: `None`
    means every GPU, or every logical CPU device on a machine without GPU
    (`multigpu.virtual_devices(n)`), or the single device of a one-device
    machine. The same devices and cross-device ops always give back the same
    strategy object, and strategies over different device sets can train in
    one process (each has its own collective-key range).

    Args:
        devices: `None`, an int >= 2, a list of >= 2 GPU ids, or a list of
            >= 2 device names; see `multigpu.resolve_devices`.
        cross_device_ops: How gradients are all-reduced. `None` lets
            TensorFlow choose (collective ops: NCCL on GPUs, ring on CPUs);
            `"nccl"`, `"hierarchical_copy"` or `"reduce_to_one"`; or a
            `tf.distribute.CrossDeviceOps` instance.

    Returns:
        A `tf.distribute.MirroredStrategy` (subclass `ExplainingMirroredStrategy`)
        with `num_replicas_in_sync == len(resolve_devices(devices))`.

    Raises:
        ValueError: for invalid `devices` (see `resolve_devices`) or an
            unknown `cross_device_ops` name.
        TypeError: if `cross_device_ops` is of the wrong type.

    Example:
    >>> strategy = multigpu.mirrored_strategy()
    >>> with strategy.scope():
    ...     model = build_model()
    ...     model.compile(optimizer="adam", loss="mse")
    >>> model.fit(multigpu.distributed_dataset(x, y, strategy=strategy))
    """
    backends.require_backend("mirrored_strategy", TF_DISTRIBUTE)
    return strategy_over(devices_lib.resolve_devices(devices), cross_device_ops)


def strategy_over(devices, cross_device_ops=None):
    """The cached `ExplainingMirroredStrategy` over already resolved devices.

    `mirrored_strategy` resolves its argument and calls this; the mirrored
    engine of `multi_gpu_model` calls it with the devices it resolved.

    Args:
        devices: Canonical device names from `resolve_devices` (one or more).
        cross_device_ops: As for `mirrored_strategy`.

    Returns:
        The strategy over `devices`, created on first use.
    """
    backends.require_backend("mirrored_strategy", TF_DISTRIBUTE)
    resolved = tuple(devices)
    ops_key, ops = _cross_device_ops(cross_device_ops)
    key = (resolved, ops_key)
    with STATE.lock:
        cached = STATE.mirrored.get(key)
        if cached is None:
            base = _KEY_BASE_START + next(STATE.key_bases) * _KEY_STRIDE
            strategy = ExplainingMirroredStrategy(
                list(resolved), cross_device_ops=ops, collective_key_base=base
            )
            # Keep the ops object alive so its id() is not reused.
            cached = STATE.mirrored[key] = (strategy, cross_device_ops)
    return cached[0]


def _signal_ready():
    """Tells `multigpu.launch` this worker has joined its cluster."""
    config = cluster_lib.tf_config() or {"task": {"index": 0}}
    signal_ready(config["task"]["index"])


def _restart_for_collective_ops():
    """Collective ops are configured before TensorFlow starts: restart it if unused."""
    alive = tensorflow_runtime.restart_unused_tensorflow()
    if alive:
        raise RuntimeError(
            f"{api('multi_worker_strategy')} came too late: TensorFlow already "
            "started and objects created on its devices still exist "
            f"({', '.join(alive)}). A multi-worker strategy configures "
            "TensorFlow's collective ops, which is possible only before: call "
            f"it first thing{tensorflow_runtime.first_thing_where()}, or restart the "
            "session."
        )


def multi_worker_strategy():
    """A `tf.distribute.MultiWorkerMirroredStrategy` for this process.

    The cluster comes from what the cluster manager provides (see
    `multigpu.cluster.resolver.cluster_resolver`), in this order: `TF_CONFIG` (set by
    Kubernetes/Kubeflow TFJobs, Vertex AI, or `python -m multigpu.launch
    --workers N` on one machine); a Slurm job step with more than one task
    (`srun -n2 python train.py`, through TensorFlow's
    `SlurmClusterResolver`; on GPU nodes each task gets its share of the
    node's GPUs through `CUDA_VISIBLE_DEVICES`, so call this first in the
    script); otherwise this process is the only worker, with a warning when
    the environment looks like a multi-task job it cannot join. TensorFlow
    allows one such strategy per process, so every call returns the same
    object. Creating it waits until every worker of the cluster has joined
    (one tiny all-reduce), so a cluster that cannot form fails here, not in
    the middle of the first step.

    Train with `multigpu.fit_distributed(model, dataset)`: Keras 3's
    `model.fit` fails under this strategy. `strategy.cluster_resolver.task_id`
    is this worker's index (0 writes the checkpoints).

    Returns:
        A `tf.distribute.MultiWorkerMirroredStrategy`.

    Raises:
        multigpu.cluster.resolver.ClusterError: (a `ValueError`) if `TF_CONFIG` is
            not a valid cluster spec, or a Slurm step's variables are
            incomplete; the message names what was found and what is missing.

    Example:
    >>> strategy = multigpu.multi_worker_strategy()
    >>> with strategy.scope():
    ...     model = build_and_compile_model()
    >>> data = multigpu.distributed_dataset(x, y, 64, strategy=strategy)
    >>> history = multigpu.fit_distributed(model, data, epochs=3)
    """
    backends.require_backend("multi_worker_strategy", TF_DISTRIBUTE)
    with STATE.lock:
        if STATE.multi_worker is not None:
            return STATE.multi_worker
        resolver = cluster_lib.cluster_resolver()
        try:
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver)
        except RuntimeError as error:
            # Several workers need collective ops, configured only before
            # TensorFlow starts (R's keras3 starts it when Keras loads).
            if "configured at program startup" not in str(error):
                raise
            _restart_for_collective_ops()
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver)
        # A barrier: returns once every worker is up and connected.
        strategy.reduce(
            tf.distribute.ReduceOp.SUM,
            strategy.run(lambda: tf.constant(1.0)),
            axis=None,
        )
        STATE.multi_worker = strategy
    _signal_ready()
    return strategy
