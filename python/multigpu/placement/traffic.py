"""Traffic between devices as a report counts it, on every backend.

`Transfer` is one tensor crossing from one device to another in a step,
with its kind among `KINDS`; the totals per pair, kind and device, and the
ring all-reduce bound, are what the placement report and `ScalingMonitor`
read. TensorFlow's transfers are measured in `communication`, JAX's read
from the compiled program in `xla`; this module imports neither backend.
"""

import collections

from multigpu.variables import variable_bytes

# The kinds of traffic, in the order reports list them.
KINDS = (
    "weights",              # variable values read on another device
    "activations",          # forward tensors: inputs, outputs, between stages
    "activation gradients", # backward tensors that are not weight gradients
    "gradients",            # weight gradients sent to the weights' device
    "all-reduce",           # collective traffic (ring algorithm's bytes)
)

Transfer = collections.namedtuple(
    "Transfer", ["source", "destination", "kind", "tensor", "bytes"]
)
Transfer.__doc__ = """One tensor crossing from `source` to `destination` device.

`bytes` is None when the tensor's size was not recorded (an op the
debugger does not instrument, e.g. one created by Grappler).
"""


def ring_allreduce_bytes(nbytes, num_devices):
    """Bytes each device sends (and receives) in a ring all-reduce.

    Reduce-scatter then all-gather: each of the `2 (n - 1)` rounds moves
    one `n`-th of the buffer, so every device sends `2 (n - 1) / n` times
    the buffer. No all-reduce algorithm moves fewer bytes per device
    (Patarasuk and Yuan, 2009), which makes it the bound reports compare
    engines against.

    Args:
        nbytes: Size of the buffer reduced (e.g. all gradients), in bytes.
        num_devices: Devices taking part, `n >= 1`.

    Returns:
        Bytes per device, a float (0 for one device).

    Example:
    >>> ring_allreduce_bytes(1000, 4)
    1500.0
    """
    if num_devices <= 1:
        return 0.0
    return 2.0 * (num_devices - 1) / num_devices * nbytes


def bytes_by_pair(transfers):
    """Bytes per `(source, destination, kind)`; unknown sizes count 0.

    Returns:
        A dict `{(source, destination, kind): bytes}`.
    """
    totals = collections.Counter()
    for t in transfers:
        totals[(t.source, t.destination, t.kind)] += t.bytes or 0
    return dict(totals)


def bytes_by_kind(transfers):
    """Bytes per kind of traffic, every kind of `KINDS` present."""
    totals = dict.fromkeys(KINDS, 0)
    for t in transfers:
        totals[t.kind] += t.bytes or 0
    return totals


def bytes_by_device(transfers):
    """Bytes each device sends and receives.

    Returns:
        A dict `{device: (sent, received)}`.
    """
    sent, received = collections.Counter(), collections.Counter()
    for t in transfers:
        sent[t.source] += t.bytes or 0
        received[t.destination] += t.bytes or 0
    return {d: (sent[d], received[d]) for d in set(sent) | set(received)}


def gradient_bytes(model):
    """Bytes of one copy of a model's trainable weights (and gradients)."""
    seen = {id(w): w for w in model.trainable_weights}
    return sum(variable_bytes(w) for w in seen.values())
