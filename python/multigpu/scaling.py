"""Predicted step time and speed-up on real links, from measured bytes.

The bytes a training step moves between devices do not depend on the
hardware: `placement_report` counts them exactly on logical CPU devices.
This module turns them, with a per-replica compute time, into a step time
on a named link:

    t_comm(n) = max over devices d of max(sent_d, received_d) / bandwidth
    t_step(n) = t_compute + t_comm(n)              (no overlap, default)
              = max(t_compute, t_comm(n))          (overlap=True)
    speed-up(n) = n * t_compute / t_step(n)

with the per-replica batch fixed (a replica's rows, so `t_compute`, do not
change with `n`: weak scaling, the global batch grows with `n`) and the
reference one device training the same rows with nothing to move.

Assumptions, each an optimist's or a pessimist's:

* every device has one full-duplex port of the link's bandwidth, and
  transfers of different devices run in parallel (a switched fabric:
  NVSwitch, or a PCIe switch with enough upstream lanes); a device's own
  transfers share its port, so the busiest device sets the time;
* the nominal bandwidth is reached (real copies reach about 80-90% on
  PCIe, NCCL's bus bandwidth about 80% of NVLink's);
* no latency per transfer (it matters for many small tensors, as in the
  benchmark's small models; NCCL's is a few microseconds per step);
* no overlap of compute and communication, unless `overlap=True` (NCCL
  all-reduces gradients while the backward pass still runs; the replicate
  engine's weight reads and gradient sums are on the critical path).
"""

import collections

from multigpu import messages

Link = collections.namedtuple("Link", ["name", "bandwidth", "source"])
Link.__doc__ = """A link between devices: `bandwidth` in bytes/s per direction."""

# Nominal bandwidth per direction per device.
LINKS = {
    "pcie4": Link(
        "PCIe 4.0 x16", 31.5e9,
        "16 GT/s x 16 lanes x 128/130 encoding = 31.5 GB/s per direction"),
    "nvlink3": Link(
        "NVLink 3 (A100)", 300e9,
        "12 links x 25 GB/s per direction = 300 GB/s (600 GB/s total)"),
    "nvlink4": Link(
        "NVLink 4 (H100)", 450e9,
        "18 links x 25 GB/s per direction = 450 GB/s (900 GB/s total)"),
    "host_memory": Link(
        "host memory", 25.6e9,
        "one DDR4-3200 channel, 25.6 GB/s; between logical CPU devices "
        "TensorFlow passes references, so no copy is made at all"),
}

Prediction = collections.namedtuple(
    "Prediction", ["link", "devices", "compute_seconds", "comm_seconds",
                   "step_seconds", "speedup"]
)


def busiest_bytes(traffic):
    """Bytes through the busiest device's port, one direction.

    Args:
        traffic: `{device: (sent, received)}`
            (`multigpu.communication.bytes_by_device`), or a
            `PlacementReport` (its `sent_bytes`/`received_bytes`).

    Returns:
        `max over devices of max(sent, received)`, 0 with no traffic.
    """
    if isinstance(traffic, list):
        traffic = {r["device"]: (r["sent_bytes"] or 0, r["received_bytes"] or 0)
                   for r in traffic}
    return max((max(sent, received) for sent, received in traffic.values()),
               default=0)


def _link(link):
    if isinstance(link, Link):
        return link
    if isinstance(link, str) and link in LINKS:
        return LINKS[link]
    raise ValueError(
        f"Invalid `link`: received {messages.literal(link)}; expected one of "
        f"{messages.literals(sorted(LINKS))} or a multigpu.scaling.Link."
    )


def predict_step(traffic, compute_seconds, link, devices, overlap=False):
    """Step time and speed-up of one configuration on a link.

    Args:
        traffic: What one step moved on `devices` devices: a
            `PlacementReport` or `{device: (sent, received)}`.
        compute_seconds: One replica's compute time per step (its rows),
            in seconds, > 0: measured, or from the GPU's data sheet.
        link: A name of `LINKS` (`"pcie4"`, `"nvlink3"`, `"nvlink4"`,
            `"host_memory"`) or a `Link`.
        devices: Number of devices the traffic was measured on.
        overlap: Whether communication overlaps compute.

    Returns:
        A `Prediction(link, devices, compute_seconds, comm_seconds,
        step_seconds, speedup)`.

    Raises:
        ValueError: for an unknown link or a compute time that is not > 0.

    Example:
    >>> report = multigpu.placement_report(parallel, x, y, print_table=False)
    >>> predict_step(report, 0.050, "pcie4", devices=4).speedup
    3.1...
    """
    chosen = _link(link)
    if isinstance(compute_seconds, bool) or not isinstance(
            compute_seconds, (int, float)) or not compute_seconds > 0:
        raise ValueError(
            "Invalid `compute_seconds`: received "
            f"{messages.literal(compute_seconds)}; expected one replica's "
            "compute time per step in seconds, a number > 0."
        )
    comm = busiest_bytes(traffic) / chosen.bandwidth
    step = (max(compute_seconds, comm) if overlap
            else compute_seconds + comm)
    return Prediction(chosen.name, devices, compute_seconds, comm, step,
                      devices * compute_seconds / step)


EngineChoice = collections.namedtuple(
    "EngineChoice", ["engine", "reason", "fallback"], defaults=[None])
EngineChoice.__doc__ = """The engine `multi_gpu_model` runs, and why.

`fallback` is None, or why the predicted winner could not be used (an
argument or a model it cannot take); `engine` is then the one used instead.
"""


def choose_engine(devices):
    """The engine of `multi_gpu_model` that should be fastest on `devices`.

    From the byte counts (docs/benchmarks.md, "Where the bytes go"): per
    step, the replicate engine's first device sends `n - 1` copies of the
    weights and receives `n - 1` copies of the gradients, where the
    mirrored engine's ring all-reduce moves `2 (n - 1) / n` copies per
    device. On GPUs, from 3 devices on, that makes the mirrored engine the
    predicted winner; on 2 GPUs both move one copy and the replicate
    engine's smaller fixed cost decides. On logical CPU devices the copies
    are references and the replicate engine is the measured winner.

    Args:
        devices: Canonical device names (`multigpu.resolve_devices`).

    Returns:
        An `EngineChoice(engine, reason)`.

    Example:
    >>> choose_engine(["/device:GPU:%d" % i for i in range(8)]).engine
    'mirrored'
    """
    devices = list(devices)
    gpus = [d for d in devices if "GPU" in d.upper()]
    if len(gpus) >= 3:
        n = len(devices)
        return EngineChoice("mirrored", (
            f"on {n} GPUs the replicate engine's first device would send "
            f"{n - 1} copies of the weights and receive {n - 1} copies of "
            f"the gradients per step; the mirrored engine's all-reduce "
            f"moves {2 * (n - 1) / n:.2f} copies per device"))
    if gpus:
        return EngineChoice("replicate", (
            "on 2 GPUs both engines move one copy of the weights per device "
            "per step; the replicate engine has the smaller fixed cost"))
    return EngineChoice("replicate", (
        "on logical CPU devices transfers are references, not copies; the "
        "replicate engine is the measured winner (docs/benchmarks.md)"))


def auto_engine(devices, cpu_merge=True):
    """What `engine="auto"` runs on `devices`, given the other arguments.

    The predicted winner (`choose_engine`), unless an argument rules it
    out: `cpu_merge=False` places a merge step that only the replicate
    engine has. A model the mirrored engine cannot copy, or whose copy
    computes otherwise (`multigpu.copies.check_copy`), is found only when
    the copy is made (`multi_gpu_model` falls back then).

    Args:
        devices: Canonical device names (`multigpu.resolve_devices`).
        cpu_merge: The `cpu_merge` argument of `multi_gpu_model`.

    Returns:
        An `EngineChoice`; its `fallback` says why the predicted winner
        is not the engine, or is None.

    Example:
    >>> auto_engine(["/device:GPU:%d" % i for i in range(4)],
    ...             cpu_merge=False).engine
    'replicate'
    """
    choice = choose_engine(devices)
    if choice.engine == "mirrored" and cpu_merge is False:
        return fall_back_to_replicate(choice, (
            f"{messages.setting('cpu_merge', False)} places the merge of "
            "replica outputs on the first device, a step only the replicate "
            "engine has"))
    return choice


def fall_back_to_replicate(choice, why):
    """The replicate engine instead of `choice`'s, with `why` as fallback.

    Args:
        choice: The `EngineChoice` that could not be used.
        why: Why, one clause naming the argument or the model.

    Returns:
        An `EngineChoice` of the replicate engine.
    """
    return EngineChoice("replicate", choice.reason, fallback=why)


def fallback_message(choice):
    """The warning `multi_gpu_model` gives when `engine="auto"` falls back.

    Args:
        choice: An `EngineChoice` whose `fallback` is set.

    Returns:
        One message naming the predicted engine, why, and what runs.
    """
    auto = messages.setting("engine", "auto")
    return (
        f"{auto} would pick the mirrored engine ({choice.reason}), but "
        f"{choice.fallback}: using {messages.setting('engine', 'replicate')}. "
        f"Pass {messages.setting('engine', 'replicate')} to choose it and "
        "silence this warning."
    )
