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
            (`multigpu.placement.traffic.bytes_by_device`), or a
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
        f"{messages.literals(sorted(LINKS))} or a multigpu.insight.scaling.Link."
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
