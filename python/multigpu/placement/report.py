"""`placement_report`: where a model's weights live and one step's work runs.

TensorFlow's report reads the graphs and profile of a step it ran
(`graphs`, `profiler`, `communication`, `step`), JAX's the program XLA
compiled (`xla`); each is imported by its branch, so that the report on
JAX needs no TensorFlow.
"""

import collections

from multigpu import backends
from multigpu import devices as devices_lib
from multigpu.messages import setting
from multigpu.placement.arguments import check_report_args, check_trainable
from multigpu.placement.table import PlacementReport
from multigpu.placement.traffic import bytes_by_device, gradient_bytes


def report_devices(observed):
    """The machine's devices (GPUs first) and any other device observed."""
    machine = devices_lib.available_devices()
    ordered = list(machine["GPU"]) + list(machine["CPU"])
    return ordered + sorted(d for d in observed if d not in ordered)


def strategy_input_note(model):
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
    `multigpu.placement.communication`). Works for any
    model: one returned by `multi_gpu_model` or `model_parallel`, one built
    under a `tf.distribute` strategy (mirrored weights count once per
    device), or a plain model.

    With `x` (and `y`), one step runs on that batch: a prediction step, or a
    training step when `y` is given (the model must be compiled). The step
    runs four times (sized, observed, warm-up, profiled); weights, optimizer and
    metric state are restored afterwards, so the model is left unchanged.

    On the JAX backend the step is compiled on the batch and not run: the
    report reads the program XLA compiled for it (`multigpu.placement.xla`),
    which every device of the executable runs on its share. Weights are
    the step's variables on the devices of their compiled sharding, `ops`
    the instructions of that program, `sent_bytes` and `received_bytes`
    its collectives' ring traffic, and `time_share` is None. Each row also
    has `rows` (the batch's rows the device computes on, XLA's padding
    excluded: 3, 3, 3 and 1 for 10 rows on 4 devices; the whole batch on
    each device of an unsplit step; 0 on a device outside the step),
    `slice_rows` (the rows of its compiled slice, padding included) and
    `collectives` (collective ops it runs per step); the report's
    `.collectives` lists them and `.batch_rows` is the batch's rows. With
    only `x` it is a prediction step; without `x`, the weights where their
    arrays are.

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
        UnsupportedBackendError: on a backend other than TensorFlow and
            JAX (PyTorch).
        RuntimeError: if the step ran eagerly, so no graph was observed
            (TensorFlow), or the compiled step's partitions have no known
            devices (JAX).

    Example:
    >>> report = multigpu.placement_report(parallel, x[:64], y[:64])
    device         variables  variable bytes  ops  time share     sent  received
    /device:CPU:0          4        1.3 KiB    38       31.0%  1.1 KiB   1.0 KiB
    ...
    >>> [row["device"] for row in report if not row["ops"]]   # idle devices
    []
    """
    check_report_args(model, x, y, print_table)
    make_report = _REPORT_MAKERS[backends.check_supported("placement_report")]
    report = make_report(model, x, y)
    if print_table:
        print(report.table())
    return report


def tensorflow_report(model, x, y):
    """`placement_report` on the TensorFlow backend, from a step it ran.

    The step runs on the batch, observed (`multigpu.placement.step`), and
    the model is restored after it.
    """
    from multigpu.placement import communication, profiler, step
    from multigpu.placement.graphs import PLUMBING_OPS, variables_by_device

    variables = variables_by_device(model)
    nodes, times, transfers, notes = None, None, None, []
    if x is None:
        notes.append(f"no batch given ({setting('x', None)}): weights only; pass x (and y) "
                     "to observe a prediction (training) step")
    else:
        kind, node_defs, nodes, sizes, times, time_note = step.observe_step(
            model, x, y)
        transfers = step.model_transfers(model, node_defs, sizes, variables)
        notes.append(f"ops: executed in one {kind} step (run metadata), "
                     "transfers and function boundaries excluded")
        if kind == "train" and model.distribute_strategy.num_replicas_in_sync > 1:
            notes.append(strategy_input_note(model))
    devices = report_devices(
        set(variables) | {n.device for n in nodes or []}
    )
    shares = None
    if nodes is not None:
        if times is None:
            notes.append(f"time share unavailable: {time_note}")
        else:
            shares, share_note = profiler.time_shares(times, nodes, devices)
            notes.append(share_note if shares is not None
                         else f"time share unavailable: {share_note}")
    ops = collections.Counter(
        n.device for n in nodes or [] if n.op not in PLUMBING_OPS
    )
    moved = bytes_by_device(transfers or [])
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
    return PlacementReport(
        rows, notes, transfers=transfers,
        gradient_bytes=gradient_bytes(model),
        replicas=max(1, sum(1 for r in rows if r["ops"])),
    )


def jax_report(model, x, y):
    """`placement_report` on the JAX backend, from the step XLA compiled.

    The step is compiled on the batch, not run (`multigpu.placement.xla`):
    the rows, weights, ops and collectives are those of the program each
    device of the executable runs.
    """
    from multigpu.placement import xla  # imports JAX: on the JAX backend only

    if x is None:
        return jax_rows_report(model, xla.placed_weights(model), None, [
            f"no batch given ({setting('x', None)}): weights only, where their "
            "arrays are; pass x (and y) to read a compiled prediction "
            "(training) step"])
    if y is not None:
        check_trainable(model)
    compiled = xla.observe_compiled_step(model, x, y)
    return jax_rows_report(model, compiled["weights"], compiled,
                           jax_notes(compiled))


def jax_notes(compiled):
    """The notes of a JAX report: what was compiled, and how to read it."""
    devices, kind = compiled["devices"], compiled["kind"]
    notes = [
        f"compiled, not run: jax.jit(model.{kind}_step) lowered on this "
        "batch and compiled by XLA, as fit compiles it; one partitioned "
        f"program, run by each of its {len(devices)} device(s)",
    ]
    total = compiled["batch_rows"]
    if compiled["split"]:
        size = next(iter(compiled["slice_rows"].values()))
        padded = size * len(devices)
        notes.append(
            f"rows: the batch's {total} rows split by XLA, a slice of {size} "
            f"per device" + (f" ({padded - total} row(s) of padding excluded)"
                             if padded > total else ""))
    elif total is not None:
        notes.append(f"rows: the batch is not split (no device takes a slice "
                     f"of it at an offset from its partition-id); each device "
                     f"of the step computes on all {total} rows")
    notes.append("ops: instructions of the compiled program (a fusion "
                 "counts once; parameters, constants and tuples excluded)")
    collectives = compiled["collectives"]
    if collectives:
        ops = collections.Counter(c.op for c in collectives)
        notes.append(
            "collectives per device and step: "
            + ", ".join(f"{n} {op}" for op, n in sorted(ops.items()))
            + f", {sum(c.bytes for c in collectives)} bytes in; sent and "
            "received: the ring algorithm's bytes of each")
    else:
        notes.append("collectives: none in the compiled step")
    notes.append("time share: not measured on JAX (the step is compiled, "
                 "not run)")
    return notes


def jax_rows_report(model, weights, compiled, notes):
    """A `PlacementReport` of JAX's placement: one row per device."""
    transfers = None if compiled is None else compiled["transfers"]
    moved = bytes_by_device(transfers or [])
    running = [] if compiled is None else compiled["devices"]
    devices = report_devices(set(weights) | set(running))
    counted = compiled is not None and compiled["batch_rows"] is not None

    rows = [
        {
            "device": device,
            "variables": weights.get(device, (0, 0))[0],
            "variable_bytes": weights.get(device, (0, 0))[1],
            "ops": None if compiled is None
            else (compiled["ops"] if device in running else 0),
            "time_share": None,
            "sent_bytes": None if compiled is None
            else moved.get(device, (0, 0))[0],
            "received_bytes": None if compiled is None
            else moved.get(device, (0, 0))[1],
            "rows": compiled["rows"].get(device, 0) if counted else None,
            "slice_rows": (compiled["slice_rows"].get(device, 0) if counted
                           else None),
            "collectives": None if compiled is None
            else (len(compiled["collectives"]) if device in running else 0),
        }
        for device in devices
    ]
    if compiled is not None:
        idle = [r["device"] for r in rows if not r["ops"]]
        notes = notes + [
            f"{len(rows) - len(idle)} of {len(rows)} devices run the step"
            + (f"; idle: {', '.join(idle)}" if idle else "")]
    return PlacementReport(
        rows, notes, transfers=transfers,
        gradient_bytes=gradient_bytes(model),
        replicas=max(1, len(running)),
        collectives=None if compiled is None else [
            {"name": c.name, "op": c.op, "bytes": c.bytes,
             "devices": len(running)} for c in compiled["collectives"]],
        batch_rows=None if compiled is None else compiled["batch_rows"],
    )


# Each backend's way to observe a step, by the name `backends.check_supported`
# returns.
_REPORT_MAKERS = {"tensorflow": tensorflow_report, "jax": jax_report}
