"""`placement_report`: where a model's weights live and one step's work runs."""

import collections

from multigpu import devices as devices_lib
from multigpu.messages import setting
from multigpu.placement import communication, profiler, step
from multigpu.placement.graphs import PLUMBING_OPS, gradient_bytes, variables_by_device
from multigpu.placement.table import PlacementReport


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
    step.check_report_args(model, x, y, print_table)
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
