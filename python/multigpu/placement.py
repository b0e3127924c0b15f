"""Observing where TensorFlow really keeps weights and runs the ops of a step.

Device scopes are requests; the placer decides. This module reads the
partition graphs TensorFlow executed (run metadata), one per device, so tests
and reports state what ran where rather than what was asked for, and the
profiler's trace for how long each device's ops took.
"""

import collections
import glob
import os
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from multigpu import devices as devices_lib
from multigpu.messages import literal, literals, setting

# Nodes that move data, route it through lowered control flow, or mark
# function boundaries rather than compute.
PLUMBING_OPS = frozenset({
    "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval", "NoOp",
    "_Send", "_Recv", "_HostSend", "_HostRecv",
    "Switch", "Merge", "Identity",
})

ExecutedNode = collections.namedtuple("ExecutedNode", ["device", "op", "name"])


def _short_device(name):
    return "/device:" + name.rsplit("/device:", 1)[-1]


def executed_nodes(fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` and lists every node TensorFlow executed.

    Only nodes of compiled functions (`tf.function`, and so Keras `fit`,
    `predict`, `evaluate` steps) are seen, and only for functions
    instantiated during the call: TensorFlow exports a function's partition
    graphs once, when it first runs with run metadata enabled. Calling a
    Keras method whose step function already ran this way sees nothing; use
    a fresh model or `placement_report`, which rebuilds the step function.

    Args:
        fn: A callable that runs one or more TensorFlow functions.
        *args: Positional arguments for `fn`.
        **kwargs: Keyword arguments for `fn`.

    Returns:
        A tuple `(result, nodes)`: what `fn` returned, and a list of
        `ExecutedNode(device, op, name)` with device names shortened to
        `"/device:TYPE:N"`.

    Example:
    >>> _, nodes = executed_nodes(model.predict_on_batch, x)
    >>> {n.device for n in nodes if "/stage1/" in n.name}
    {'/device:CPU:1'}
    """
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        # Drop graphs recorded earlier (functions instantiated since the last
        # export), so only this call's graphs are returned.
        ctx.export_run_metadata()
        result = fn(*args, **kwargs)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    nodes = [
        ExecutedNode(_short_device(node.device), node.op, node.name)
        for function_graph in metadata.function_graphs
        for partition in function_graph.partition_graphs
        for node in partition.node
    ]
    return result, nodes


def executed_ops(fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` and counts the ops each device executed.

    Same observation as `executed_nodes` (and the same caveat: only
    functions instantiated during the call are seen).

    Args:
        fn: A callable that runs one or more TensorFlow functions.
        *args: Positional arguments for `fn`.
        **kwargs: Keyword arguments for `fn`.

    Returns:
        A tuple `(result, counts)`: what `fn` returned, and a
        `collections.Counter` keyed by `(device, op_type)`, with device names
        shortened to `"/device:TYPE:N"`.

    Example:
    >>> _, ops = executed_ops(parallel.predict, x, verbose=0)
    >>> ops[("/device:CPU:1", "_MklNativeFusedMatMul")]
    2
    """
    result, nodes = executed_nodes(fn, *args, **kwargs)
    return result, collections.Counter((n.device, n.op) for n in nodes)


def ops_by_device(counts, op_filter=None):
    """Sums `executed_ops` counts per device, optionally for some op types.

    Args:
        counts: The Counter returned by `executed_ops`.
        op_filter: Optional predicate on the op type, e.g.
            `lambda op: "MatMul" in op`.

    Returns:
        A dict `{device: count}`.
    """
    totals = collections.Counter()
    for (device, op), n in counts.items():
        if op_filter is None or op_filter(op):
            totals[device] += n
    return dict(totals)


# ---------------------------------------------------------------------------
# Variables.


def variable_components(variable):
    """The per-device TensorFlow variables behind a Keras or TF variable.

    A variable created under a `tf.distribute` strategy (a MirroredVariable)
    has one component per device; any other variable has one.

    Returns:
        A list of `(device, variable)` pairs, devices as `"/device:TYPE:N"`.
    """
    handle = getattr(variable, "value", variable)
    if isinstance(handle, tf.distribute.DistributedValues):
        parts = list(handle.values)
    else:
        parts = [handle]
    return [(_short_device(part.device), part) for part in parts]


def _nbytes(variable):
    return int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size


def variables_by_device(model):
    """Number and bytes of a model's weights on each device.

    Args:
        model: A Keras model (replicated, partitioned, strategy-built or
            plain). Each weight is counted once; a mirrored weight once per
            device that holds a copy.

    Returns:
        A dict `{device: (count, bytes)}`.
    """
    totals = collections.defaultdict(lambda: [0, 0])
    seen = set()
    for weight in model.weights:
        if id(weight) in seen:
            continue
        seen.add(id(weight))
        for device, part in variable_components(weight):
            totals[device][0] += 1
            totals[device][1] += _nbytes(part)
    return {device: tuple(v) for device, v in totals.items()}


# ---------------------------------------------------------------------------
# One step: which step, with the model left as it was.


def _state_variables(model):
    optimizer = getattr(model, "optimizer", None)
    state = list(model.variables) + list(getattr(model, "metrics_variables", []))
    if optimizer is not None:
        state += list(optimizer.variables)
    return list({id(v): v for v in state}.values())


def _step_runner(model, x, y):
    """A function running one step on (x, y), and its kind."""
    if y is None:
        return (lambda: model.predict_on_batch(x)), "predict", "predict_function"
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"Invalid `y`: received targets, but model {literal(model.name)} is not "
            "compiled, so it has no training step. Call model.compile(...) "
            f"first, or pass {setting('y', None)} to observe a prediction step."
        )
    if not model.optimizer.built:
        # Built now (in the model's strategy) so that its state is restored.
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)
    return (lambda: model.train_on_batch(x, y)), "train", "train_function"


class _Restored:
    """Runs steps, then puts weights, optimizer and metric state back."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.variables = _state_variables(self.model)
        self.values = [v.numpy() for v in self.variables]
        return self

    def __exit__(self, *exc):
        for variable, value in zip(self.variables, self.values):
            variable.assign(value)
        return False


def _fresh_function(model, attribute):
    """Forgets the model's compiled step so the next step re-instantiates."""
    previous = getattr(model, attribute, None)
    setattr(model, attribute, None)
    return previous


# ---------------------------------------------------------------------------
# Time per device: the profiler's trace.


def _trace_op_times(run):
    """Runs `run()` under the TensorFlow profiler; op time by node name.

    Returns:
        `(times, note)`: `times` maps executed node name to its total
        kernel duration in seconds (or None), `note` says why when None.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as logdir:
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2)
        try:
            tf.profiler.experimental.start(logdir, options=options)
        except Exception as error:  # noqa: BLE001 - any profiler failure
            return None, f"the TensorFlow profiler could not start: {error}"
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                          recursive=True)
        if not paths:
            return None, "the TensorFlow profiler wrote no trace"
        space = xplane_pb2.XSpace()
        with open(paths[0], "rb") as handle:
            space.ParseFromString(handle.read())
    return _times_from_space(space), None


def _times_from_space(space):
    """Kernel time per node name (host ops) and per device plane (GPUs)."""
    times = collections.Counter()
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        if plane.name.startswith("/device:GPU:"):
            # GPU kernels run on streams; their time is the device's.
            device = plane.name
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    for event in line.events:
                        times[("@device", device)] += event.duration_ps * 1e-12
            continue
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                node, sep, op = name.partition(":")
                if sep and op and not op.startswith((":", " ")):
                    times[("@node", node)] += event.duration_ps * 1e-12
    return times


def _time_shares(times, nodes, devices):
    """Share of kernel time per device, and a note on what was attributed."""
    device_of = collections.defaultdict(set)
    for node in nodes:
        device_of[node.name].add(node.device)
    per_device = collections.Counter()
    unattributed = 0.0
    gpu_planes = {k[1] for k in times if k[0] == "@device"}
    for (kind, key), seconds in times.items():
        if kind == "@device":
            per_device[key] += seconds
            continue
        candidates = device_of.get(key)
        if not candidates:
            continue  # not a node of this step (e.g. a runtime annotation)
        if len(candidates) > 1:
            unattributed += seconds
            continue
        device = next(iter(candidates))
        if device in gpu_planes:
            continue  # its host-side launch; the kernel time is counted above
        per_device[device] += seconds
    total = sum(per_device.values())
    if total <= 0:
        return None, "the profiler trace held no op of this step"
    shares = {d: per_device.get(d, 0.0) / total for d in devices}
    note = (
        "time share: share of the step's kernel time (TensorFlow profiler) "
        "spent on each device; devices run concurrently, so this measures "
        "work, not wall time"
    )
    if unattributed >= 0.005 * (total + unattributed):
        note += (
            f"; {unattributed / (total + unattributed):.0%} of the traced op "
            "time could not be matched to one device and is left out"
        )
    return shares, note


# ---------------------------------------------------------------------------
# The report.


def _report_devices(observed):
    machine = devices_lib.available_devices()
    ordered = list(machine["GPU"]) + list(machine["CPU"])
    return ordered + sorted(d for d in observed if d not in ordered)


def _observe_step(model, x, y):
    """Ops per device of one step, time per device, notes."""
    run, kind, attribute = _step_runner(model, x, y)
    with _Restored(model):
        previous = _fresh_function(model, attribute)
        try:
            _, nodes = executed_nodes(run)
            run()  # warm-up outside run metadata, for the timed step
            times, time_note = _trace_op_times(run)
        finally:
            setattr(model, attribute, previous)
    if not nodes:
        raise RuntimeError(
            "TensorFlow exported no executed graph for this step: is the "
            f"model running eagerly ({setting('run_eagerly', True)})? Placement is observed "
            "on compiled steps only."
        )
    return kind, nodes, times, time_note


def _format_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class PlacementReport(list):
    """The rows of `placement_report` (a list of dicts), with its notes.

    Attributes:
        notes: Sentences explaining the columns and what was observed.
    """

    def __init__(self, rows, notes):
        super().__init__(rows)
        self.notes = list(notes)

    def table(self):
        """The report as the text table `placement_report` prints."""
        header = ("device", "variables", "variable bytes", "ops", "time share")
        lines = [header]
        for row in self:
            lines.append((
                row["device"],
                str(row["variables"]),
                _format_bytes(row["variable_bytes"]),
                "-" if row["ops"] is None else str(row["ops"]),
                "-" if row["time_share"] is None
                else f"{100 * row['time_share']:.1f}%",
            ))
        widths = [max(len(line[i]) for line in lines) for i in range(5)]
        text = [
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(line, widths))
            )
            for line in lines
        ]
        text.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(text + [f"* {note}" for note in self.notes])

    def __str__(self):
        return self.table()


def _check_report_args(model, x, y, print_table):
    import keras  # noqa: PLC0415 - keras is slow to import; only here

    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `model`: received an object of type "
            f"{type(model).__name__}; expected a keras.Model."
        )
    if x is None and y is not None:
        raise ValueError(
            f"Invalid `x`: received {literal(None)} with targets `y`; a training step "
            "needs inputs. Pass x (and y) for one batch."
        )
    if not isinstance(print_table, bool):
        raise ValueError(
            f"Invalid `print_table`: received {literal(print_table)}; expected "
            f"{literals([True, False])}."
        )


def placement_report(model, x=None, y=None, print_table=True):
    """Where a model's weights live and where one step's work runs.

    Answers "am I using all my devices?" in one call, from what TensorFlow
    did rather than what was asked for: weights are read from the
    variables' devices, ops from the partition graphs TensorFlow executed
    (run metadata), time from the TensorFlow profiler's trace. Works for any
    model: one returned by `multi_gpu_model` or `model_parallel`, one built
    under a `tf.distribute` strategy (mirrored weights count once per
    device), or a plain model.

    With `x` (and `y`), one step runs on that batch: a prediction step, or a
    training step when `y` is given (the model must be compiled). The step
    runs three times (observed, warm-up, profiled); weights, optimizer and
    metric state are restored afterwards, so the model is left unchanged.

    Args:
        model: A Keras model.
        x: Optional inputs of one batch (as for `predict_on_batch`). Without
            it, only weights are reported (`ops`, `time_share` are None).
        y: Optional targets of that batch, for a training step.
        print_table: Print the report as a table.

    Returns:
        A `PlacementReport`: a list with one dict per device (every device of
        the machine, so idle ones show), keys `device`, `variables` (count),
        `variable_bytes`, `ops` (ops executed in the step, without transfer
        and function-boundary nodes) and `time_share` (share of the step's
        kernel time, or None when unknown); its `.notes` say what was
        measured.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ValueError: for `y` without `x`, `y` with an uncompiled model, or a
            non-bool `print_table`.
        RuntimeError: if the step ran eagerly, so no graph was observed.

    Example:
    >>> report = multigpu.placement_report(parallel, x[:64], y[:64])
    device         variables  variable bytes  ops  time share
    /device:CPU:0          4        1.3 KiB    38       31.0%
    ...
    >>> [row["device"] for row in report if not row["ops"]]   # idle devices
    []
    """
    _check_report_args(model, x, y, print_table)
    variables = variables_by_device(model)
    nodes, times, notes = None, None, []
    if x is None:
        notes.append(f"no batch given ({setting('x', None)}): weights only; pass x (and y) "
                     "to observe a prediction (training) step")
    else:
        kind, nodes, times, time_note = _observe_step(model, x, y)
        notes.append(f"ops: executed in one {kind} step (run metadata), "
                     "transfers and function boundaries excluded")
    devices = _report_devices(
        set(variables) | {n.device for n in nodes or []}
    )
    shares = None
    if nodes is not None:
        if times is None:
            notes.append(f"time share unavailable: {time_note}")
        else:
            shares, share_note = _time_shares(times, nodes, devices)
            notes.append(share_note if shares is not None
                         else f"time share unavailable: {share_note}")
    ops = collections.Counter(
        n.device for n in nodes or [] if n.op not in PLUMBING_OPS
    )
    rows = [
        {
            "device": device,
            "variables": variables.get(device, (0, 0))[0],
            "variable_bytes": variables.get(device, (0, 0))[1],
            "ops": None if nodes is None else ops.get(device, 0),
            "time_share": None if shares is None else shares[device],
        }
        for device in devices
    ]
    if nodes is not None:
        busy = [r["device"] for r in rows if r["ops"]]
        idle = [r["device"] for r in rows if not r["ops"]]
        notes.append(
            f"{len(busy)} of {len(rows)} devices ran ops"
            + (f"; idle: {', '.join(idle)}" if idle else "")
        )
    report = PlacementReport(rows, notes)
    if print_table:
        print(report.table())
    return report
