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

import tensorflow as tf
from tensorflow.python.eager import context

from multigpu import communication, inputs
from multigpu import devices as devices_lib
from multigpu.arguments import check_flag
from multigpu.devices import short_device_name
from multigpu.messages import literal, setting
from multigpu.variables import variable_bytes, variable_components

# Nodes that move data, route it through lowered control flow, or mark
# function boundaries rather than compute.
PLUMBING_OPS = frozenset({
    "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval", "NoOp",
    "_Send", "_Recv", "_HostSend", "_HostRecv",
    "Switch", "Merge", "Identity",
})

# Where a step's inputs come from: Keras hands batches over on the host.
HOST_DEVICE = "/device:CPU:0"

ExecutedNode = collections.namedtuple("ExecutedNode", ["device", "op", "name"])


def executed_node_defs(fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)`; the NodeDefs of every executed partition.

    The partition graphs TensorFlow ran (one per device and function),
    with every attribute: `_Send`/`_Recv` nodes carry their devices and the
    tensor they move. Same caveat as `executed_nodes`.

    Args:
        fn: A callable that runs one or more TensorFlow functions.
        *args: Positional arguments for `fn`.
        **kwargs: Keyword arguments for `fn`.

    Returns:
        A tuple `(result, nodes)`: what `fn` returned, and a list of
        `(device, NodeDef)` pairs, devices shortened to `"/device:TYPE:N"`.

    Example:
    >>> _, nodes = executed_node_defs(model.predict_on_batch, x)
    >>> sorted({node.op for _, node in nodes if "Send" in node.op})
    ['_Send']
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
        (short_device_name(node.device), node)
        for function_graph in metadata.function_graphs
        for partition in function_graph.partition_graphs
        for node in partition.node
    ]
    return result, nodes


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
    result, node_defs = executed_node_defs(fn, *args, **kwargs)
    nodes = [ExecutedNode(device, node.op, node.name)
             for device, node in node_defs]
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
    if not callable(fn):
        raise TypeError(
            f"Invalid `fn`: received {_value_or_type(fn)}; expected a "
            "function that runs TensorFlow, such as model.predict, followed "
            "by its arguments."
        )
    result, nodes = executed_nodes(fn, *args, **kwargs)
    return result, collections.Counter((n.device, n.op) for n in nodes)


def _value_or_type(value):
    """A plain value as a literal, anything else by its type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return literal(value)
    return f"an object of type {type(value).__name__}"


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
            totals[device][1] += variable_bytes(part)
    return {device: tuple(v) for device, v in totals.items()}


# ---------------------------------------------------------------------------
# One step: which step, with the model left as it was.


def _state_variables(model):
    optimizer = getattr(model, "optimizer", None)
    state = list(model.variables) + list(getattr(model, "metrics_variables", []))
    if optimizer is not None:
        state += list(optimizer.variables)
    # The template of a mirrored-engine model, which its steps copy into.
    template = getattr(model, "template", None)
    if template is not None:
        state += list(template.variables)
    return list({id(v): v for v in state}.values())


def _step_runner(model, x, y):
    """A function running one step on (x, y), and its kind.

    A training step is `train_on_batch`. Under a `tf.distribute` strategy
    (a strategy-built model, the mirrored engine) Keras 3 hands every
    replica the whole batch there, where `fit` gives each replica its rows;
    the report shows what `train_on_batch` moved.
    """
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
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

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


def op_seconds(run):
    """Kernel seconds per executed node of `run()`, from the profiler's trace.

    Args:
        run: A callable running TensorFlow functions (one or more steps).

    Returns:
        A dict `{node name: seconds}` summed over every execution in the
        trace (host ops; GPU kernels are under `("@device", plane)` keys of
        the raw trace and not included), or None when the profiler could
        not trace.

    Example:
    >>> seconds = op_seconds(lambda: model.train_on_batch(x, y))
    >>> sum(seconds.values())
    0.0021...
    """
    times, _ = _trace_op_times(run)
    if times is None:
        return None
    return {key: value for (kind, key), value in times.items()
            if kind == "@node"}


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
    """One step observed: its partition graphs, tensor sizes, op times.

    Three fresh step functions would be one too many: the sizes come from
    an instrumented function (the debugger adds ops), which is dropped;
    the partition graphs and the profile come from one clean function.
    """
    run, kind, attribute = _step_runner(model, x, y)
    with _Restored(model):
        previous = _fresh_function(model, attribute)
        try:
            sizes = communication.recorded_tensor_sizes(run)
            _fresh_function(model, attribute)
            _, node_defs = executed_node_defs(run)
            run()  # warm-up outside run metadata, for the timed step
            nodes = [ExecutedNode(device, node.op, node.name)
                     for device, node in node_defs]
            times, time_note = _trace_op_times(run)
        finally:
            setattr(model, attribute, previous)
    if not node_defs:
        raise RuntimeError(
            "TensorFlow exported no executed graph for this step: is the "
            f"model running eagerly ({setting('run_eagerly', True)})? Placement is observed "
            "on compiled steps only."
        )
    return kind, node_defs, nodes, sizes, times, time_note


def _model_transfers(model, node_defs, sizes, variables):
    """The step's transfers, classified with the model's weights."""
    optimizer = getattr(model, "optimizer", None)
    return communication.step_transfers(
        node_defs, sizes,
        gradient_sizes={variable_bytes(v) for v in model.trainable_weights},
        weight_devices=[d for d, (count, _) in variables.items() if count],
        optimizer_scopes=[optimizer.name] if optimizer is not None else [],
        host=HOST_DEVICE,
    )


def step_traffic(model, x, y=None):
    """The transfers of one step, without the rest of the report.

    Runs the step twice (sized, observed) on fresh step functions and
    restores the model's state, like `placement_report`, without profiling.

    Args:
        model: A Keras model (compiled when `y` is given).
        x: Inputs of one batch.
        y: Targets of that batch for a training step, or None for a
            prediction step.

    Returns:
        A list of `multigpu.communication.Transfer`.

    Raises:
        TypeError, ValueError, RuntimeError: as `placement_report`.

    Example:
    >>> transfers = step_traffic(parallel, x[:64], y[:64])
    >>> communication.bytes_by_kind(transfers)["weights"]
    3276800
    """
    _check_report_args(model, x, y, True)
    if x is None:
        raise ValueError(
            "Invalid `x`: received None; a step needs one batch of inputs.")
    run, _, attribute = _step_runner(model, x, y)
    with _Restored(model):
        previous = _fresh_function(model, attribute)
        try:
            sizes = communication.recorded_tensor_sizes(run)
            _fresh_function(model, attribute)
            _, node_defs = executed_node_defs(run)
        finally:
            setattr(model, attribute, previous)
    return _model_transfers(model, node_defs, sizes,
                            variables_by_device(model))


def gradient_bytes(model):
    """Bytes of one copy of a model's trainable weights (and gradients)."""
    seen = {id(w): w for w in model.trainable_weights}
    return sum(variable_bytes(w) for w in seen.values())


def format_bytes(n):
    """Bytes as text in the largest binary unit below 1024: `"1.3 KiB"`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _text_table(header, rows, left=1):
    """Rows of strings as aligned text: the first `left` columns left."""
    lines = [tuple(header)] + [tuple(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(
            cell.ljust(w) if i < left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths))
        )
        for line in lines
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    return text


class PlacementReport(list):
    """The rows of `placement_report` (a list of dicts), with its notes.

    Attributes:
        notes: Sentences explaining the columns and what was observed.
        transfers: The step's `multigpu.communication.Transfer`s (tensors
            that crossed from one device to another), or None without a
            batch.
        gradient_bytes: Bytes of the model's trainable weights (one copy).
        replicas: Devices that ran ops in the step (the `n` of the bound).
        ring_bound_bytes: Bytes each of `replicas` devices sends in a ring
            all-reduce of `gradient_bytes`: `2 (n - 1) / n x gradient_bytes`.
    """

    def __init__(self, rows, notes, transfers=None, gradient_bytes=0,
                 replicas=1):
        super().__init__(rows)
        self.notes = list(notes)
        self.transfers = transfers
        self.gradient_bytes = gradient_bytes
        self.replicas = replicas
        self.ring_bound_bytes = communication.ring_allreduce_bytes(
            gradient_bytes, replicas)

    def transfer_rows(self):
        """Bytes per pair of devices and kind of traffic, one dict per pair.

        Returns:
            A list of dicts with keys `source`, `destination`, one key per
            kind of `multigpu.communication.KINDS` (bytes) and `total`.
        """
        pairs = {}
        for (source, destination, kind), nbytes in sorted(
                communication.bytes_by_pair(self.transfers or []).items()):
            row = pairs.setdefault((source, destination), dict(
                {"source": source, "destination": destination},
                **dict.fromkeys(communication.KINDS, 0)))
            row[kind] += nbytes
        for row in pairs.values():
            row["total"] = sum(row[k] for k in communication.KINDS)
        return list(pairs.values())

    def table(self):
        """The report as the text tables `placement_report` prints."""
        def show(value, formatter):
            return "-" if value is None else formatter(value)

        text = _text_table(
            ("device", "variables", "variable bytes", "ops", "time share",
             "sent", "received"),
            [(row["device"], str(row["variables"]),
              format_bytes(row["variable_bytes"]),
              show(row["ops"], str),
              show(row["time_share"], lambda v: f"{100 * v:.1f}%"),
              show(row["sent_bytes"], format_bytes),
              show(row["received_bytes"], format_bytes))
             for row in self],
        )
        if self.transfers is not None:
            pairs = self.transfer_rows()
            text.append("")
            if pairs:
                kinds = [k for k in communication.KINDS
                         if any(p[k] for p in pairs)]
                text += _text_table(
                    ["from", "to"] + kinds + ["total"],
                    [[p["source"], p["destination"]]
                     + [format_bytes(p[k]) for k in kinds]
                     + [format_bytes(p["total"])] for p in pairs],
                    left=2,
                )
            else:
                text.append("no tensor crossed a device boundary")
            text.append(self.bound_line())
        return "\n".join(text + [f"* {note}" for note in self.notes])

    def bound_line(self):
        """One sentence: the busiest device's traffic against the bound."""
        busiest = max(
            (max(r["sent_bytes"] or 0, r["received_bytes"] or 0)
             for r in self), default=0)
        return (
            f"busiest device moves {format_bytes(busiest)} per step; ring "
            f"all-reduce bound for {format_bytes(self.gradient_bytes)} of "
            f"gradients on {self.replicas} device(s): 2(n-1)/n x gradients "
            f"= {format_bytes(self.ring_bound_bytes)} per device"
        )

    def __str__(self):
        return self.table()


def _check_report_args(model, x, y, print_table):
    import keras

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
    if x is not None:
        inputs.check_rows("x", x, "placement_report")
    check_flag("print_table", print_table)


def _strategy_input_note(model):
    """How the step under a strategy received its batch: not in its graphs."""
    if getattr(model, "splits_train_on_batch", False):
        return ("the batch reaches each replica through fit's distributed "
                "input, placed on its device before the step: those rows are "
                "not among the step's transfers")
    return ("train_on_batch under a tf.distribute strategy hands every "
            "replica the whole batch (Keras 3); fit sends each replica "
            "its rows only")


def placement_report(model, x=None, y=None, print_table=True):
    """Where a model's weights live and where one step's work runs.

    Answers "am I using all my devices?" in one call, from what TensorFlow
    did rather than what was asked for: weights are read from the
    variables' devices, ops from the partition graphs TensorFlow executed
    (run metadata), time from the TensorFlow profiler's trace, and the
    bytes that crossed from device to device from the `_Send`/`_Recv`
    pairs and collective ops of those graphs (see
    `multigpu.communication`). Works for any
    model: one returned by `multi_gpu_model` or `model_parallel`, one built
    under a `tf.distribute` strategy (mirrored weights count once per
    device), or a plain model.

    With `x` (and `y`), one step runs on that batch: a prediction step, or a
    training step when `y` is given (the model must be compiled). The step
    runs four times (sized, observed, warm-up, profiled); weights, optimizer and
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
        kernel time, or None when unknown), `sent_bytes` and
        `received_bytes` (bytes the device sent to and received from other
        devices in the step, None without a batch). `.transfer_rows()`
        gives the bytes per pair of devices and kind (weights,
        activations, activation gradients, gradients, all-reduce),
        `.ring_bound_bytes` the ring all-reduce bound for the model's
        gradients on the devices that ran ops, and `.notes` say what was
        measured.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ValueError: for `y` without `x`, `y` with an uncompiled model, or a
            non-bool `print_table`.
        RuntimeError: if the step ran eagerly, so no graph was observed.

    Example:
    >>> report = multigpu.placement_report(parallel, x[:64], y[:64])
    device         variables  variable bytes  ops  time share     sent  received
    /device:CPU:0          4        1.3 KiB    38       31.0%  1.1 KiB   1.0 KiB
    ...
    >>> [row["device"] for row in report if not row["ops"]]   # idle devices
    []
    """
    _check_report_args(model, x, y, print_table)
    variables = variables_by_device(model)
    nodes, times, transfers, notes = None, None, None, []
    if x is None:
        notes.append(f"no batch given ({setting('x', None)}): weights only; pass x (and y) "
                     "to observe a prediction (training) step")
    else:
        kind, node_defs, nodes, sizes, times, time_note = _observe_step(
            model, x, y)
        transfers = _model_transfers(model, node_defs, sizes, variables)
        notes.append(f"ops: executed in one {kind} step (run metadata), "
                     "transfers and function boundaries excluded")
        if kind == "train" and model.distribute_strategy.num_replicas_in_sync > 1:
            notes.append(_strategy_input_note(model))
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
    moved = communication.bytes_by_device(transfers or [])
    rows = [
        {
            "device": device,
            "variables": variables.get(device, (0, 0))[0],
            "variable_bytes": variables.get(device, (0, 0))[1],
            "ops": None if nodes is None else ops.get(device, 0),
            "time_share": None if shares is None else shares[device],
            "sent_bytes": None if transfers is None
            else moved.get(device, (0, 0))[0],
            "received_bytes": None if transfers is None
            else moved.get(device, (0, 0))[1],
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
        notes.append(communication.environment_note())
        unknown = sum(1 for t in transfers if t.bytes is None)
        if unknown:
            notes.append(f"{unknown} transfer(s) of unknown size counted as "
                         "0 bytes (tensors the debugger did not record)")
    report = PlacementReport(
        rows, notes, transfers=transfers,
        gradient_bytes=gradient_bytes(model),
        replicas=max(1, sum(1 for r in rows if r["ops"])),
    )
    if print_table:
        print(report.table())
    return report
