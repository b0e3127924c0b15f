"""Profiler parsing: kernel time per executed node and per device.

The TensorFlow profiler's trace (an XSpace) holds host ops by node name and
GPU kernels by stream; `time_shares` turns them into each device's share of
a step's kernel time, with the nodes of the step's partition graphs.
"""

import collections
import glob
import os
import tempfile

import tensorflow as tf

from multigpu import tensorflow_internals


def trace_op_times(run):
    """Runs `run()` under the TensorFlow profiler; op time by node name.

    Returns:
        `(times, note)`: `times` maps executed node name to its total
        kernel duration in seconds (or None), `note` says why when None.
    """
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
        space = tensorflow_internals.profiler_space(paths[0])
    return times_from_space(space), None


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
    times, _ = trace_op_times(run)
    if times is None:
        return None
    return {key: value for (kind, key), value in times.items()
            if kind == "@node"}


def times_from_space(space):
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


def time_shares(times, nodes, devices):
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
