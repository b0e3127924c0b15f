"""Bytes that cross device boundaries in one step, as TensorFlow ran it.

TensorFlow splits a function into one partition graph per device and joins
them with `_Send`/`_Recv` pairs (`_HostSend`/`_HostRecv` for host-memory
tensors of a GPU); collective ops (`CollectiveReduceV2`, `NcclAllReduce`)
move data between devices without such pairs. The partition graphs name
what is sent but not how big it is, so the sizes come from a second,
instrumented run of the same step: TensorFlow's debugger
(`tf.debugging.experimental.enable_dump_debug_info`, mode `"SHAPE"`) records
the shape of every tensor the step computed, by op name. A transfer's bytes
are the recorded size of the tensor its `_Send` reads.

Between logical CPU devices of one process (`multigpu.virtual_devices`) a
transfer passes a reference to the same host buffer: the pairs are in the
partition graphs and counted here, but no byte is copied. On GPUs the same
pairs are copies over the link between the devices.
"""

import collections
import re
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from multigpu import tensorflow_internals
from multigpu.devices import short_device_name
from multigpu.placement.traffic import Transfer, ring_allreduce_bytes

SEND_OPS = frozenset({"_Send", "_HostSend"})
COLLECTIVE_OPS = frozenset({
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
    "NcclAllReduce", "CollectiveAllToAllV2", "CollectiveAllToAllV3",
    "CollectiveGather", "CollectiveGatherV2",
    "CollectiveBcastSend", "CollectiveBcastSendV2",
})
VARIABLE_READ_OPS = frozenset({"ReadVariableOp", "ResourceGather"})

# ---------------------------------------------------------------------------
# Tensor sizes of one step, from TensorFlow's debugger.


TensorSize = collections.namedtuple("TensorSize", ["op", "slot", "bytes"])


def _trace_bytes(summary):
    """Bytes of a tensor from its SHAPE-mode summary.

    The summary is `[tensor id, dtype enum, rank, element count, dims...]`.
    """
    dtype_enum, count = int(summary[1]), int(summary[3])
    try:
        size = tf.as_dtype(dtype_enum).size
    except (TypeError, ValueError):
        return None
    return count * size


# Key of a recorded op's last-dimension bytes (see `_Graph.size`).
CHANNELS = "channels"


def _channel_bytes(summary):
    """Bytes of one slice along the last axis: its channels' size."""
    rank = int(summary[2])
    if not 1 <= rank <= 6:
        return None
    try:
        size = tf.as_dtype(int(summary[1])).size
    except (TypeError, ValueError):
        return None
    return int(summary[3 + rank]) * size


def recorded_tensor_sizes(run):
    """Runs `run()` with TensorFlow's debugger recording every tensor's shape.

    Only functions traced during `run()` are instrumented: pass a `run`
    that builds its step function afresh (see `placement_report`).

    Args:
        run: A callable running one step.

    Returns:
        A dict `{(op name, output slot): [bytes, ...]}`, one entry per
        execution of that op (several for ops in loops), and under
        `(op name, CHANNELS)` the bytes of its first output's last axis.
    """
    logdir = tempfile.mkdtemp(prefix="multigpu-sizes-")
    try:
        tf.debugging.experimental.enable_dump_debug_info(
            logdir, tensor_debug_mode="SHAPE", circular_buffer_size=-1
        )
        try:
            run()
        finally:
            tf.debugging.experimental.disable_dump_debug_info()
        sizes = collections.defaultdict(list)
        for op_name, slot, summary in tensorflow_internals.recorded_graph_tensors(logdir):
            sizes[(op_name, slot)].append(_trace_bytes(summary))
            if slot == 0:
                sizes[(op_name, CHANNELS)].append(_channel_bytes(summary))
        return dict(sizes)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def _recorded_size(name, slot, sizes_by_op):
    """Bytes recorded for op `name`'s output `slot`, or None.

    Partition graphs prefix the names of inlined function bodies (e.g.
    `cond/then/_0/`); the recorded names are those of the traced graphs,
    so the longest recorded name that ends the node's name is its op.
    """
    parts = name.split("/")
    for start in range(len(parts)):
        recorded = sizes_by_op.get(("/".join(parts[start:]), slot))
        if recorded:
            known = [b for b in recorded if b is not None]
            # An op run k times (a loop) is sent k times.
            return sum(known) if known else None
    return None


# Nodes that pass a tensor on unchanged (lowered control flow, identities,
# the receiving end of a transfer): a tensor's size is its input's.
_PASS_THROUGH = frozenset({
    "Identity", "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "Exit",
    "NextIteration", "_Recv", "_HostRecv", "IdentityN", "_SwitchN",
})


def _arg_size(node):
    """Bytes of a function argument, from its recorded static shape."""
    shapes = node.attr["_output_shapes"].list.shape if (
        "_output_shapes" in node.attr) else []
    if len(shapes) != 1 or shapes[0].unknown_rank or any(
            d.size < 0 for d in shapes[0].dim):
        return None
    dtype = tf.as_dtype(node.attr["T"].type)
    if dtype in (tf.resource, tf.variant, tf.string):
        return None
    return int(np.prod([d.size for d in shapes[0].dim])) * dtype.size


class _Graph:
    """The step's partition graphs, to follow a tensor to the op that made it."""

    def __init__(self, partition_nodes):
        self.node = {}
        self.send_input = {}
        for _, node in partition_nodes:
            self.node[node.name] = node
            if node.op in SEND_OPS:
                self.send_input[node.attr["tensor_name"].s] = node.input[0]

    def producer(self, tensor, depth=0):
        """The op that computed `tensor`, seen through pass-through nodes.

        Returns:
            `(name, slot, node)`; node is None for an unknown name.
        """
        name, _, slot = tensor.lstrip("^").partition(":")
        slot = int(slot or 0)
        node = self.node.get(name)
        if node is None or node.op not in _PASS_THROUGH or depth > 50:
            return name, slot, node
        if node.op in ("_Recv", "_HostRecv"):
            upstream = self.send_input.get(node.attr["tensor_name"].s)
            return (name, slot, node) if upstream is None else self.producer(
                upstream, depth + 1)
        data = [i for i in node.input if not i.startswith("^")]
        if node.op in ("IdentityN", "_SwitchN"):
            data = data[slot: slot + 1] if node.op == "IdentityN" else data[:1]
        elif node.op in ("Switch", "RefSwitch"):
            data = data[:1]
        if not data:
            return name, slot, node
        # A Merge forwards whichever input ran; the first one recorded.
        candidates = [self.producer(i, depth + 1) for i in data]
        return candidates[0] if len(candidates) == 1 else _Merged(candidates)

    def size(self, tensor, sizes_by_op):
        """Bytes of `tensor` in the executed step, or None if unknown."""
        name, _, slot = tensor.lstrip("^").partition(":")
        direct = _recorded_size(name, int(slot or 0), sizes_by_op)
        if direct is not None:
            return direct
        found = self.producer(tensor)
        options = found.options if isinstance(found, _Merged) else [found]
        for name, slot, node in options:
            nbytes = _recorded_size(name, slot, sizes_by_op)
            if nbytes is None and node is not None and node.op == "_Arg":
                nbytes = _arg_size(node)
            if (nbytes is None and node is not None and slot == 1
                    and node.op.endswith("WithBias")):
                # Grappler fused a bias gradient into the filter gradient's
                # op (oneDNN's _MklNativeConv2DBackpropFilterWithBias): its
                # second output has one value per output channel.
                nbytes = _recorded_size(name, CHANNELS, sizes_by_op)
            if nbytes is not None:
                return nbytes
        return None


class _Merged(tuple):
    """Several candidate producers (inputs of a Merge)."""

    @property
    def options(self):
        flat = []
        for item in self:
            flat.extend(item.options if isinstance(item, _Merged) else [item])
        return flat


# ---------------------------------------------------------------------------
# Transfers of one step.


_BRANCH = re.compile(r"/(then|else)/_[0-9]+/")
_BACKWARD_MARKERS = ("gradients", "gradient_tape", "_grad/")


def _is_backward(name):
    return any(marker in name for marker in _BACKWARD_MARKERS)


def _is_control(node):
    """A dummy constant the partitioner sends for a cross-device control edge."""
    return (node is not None and node.op == "Const"
            and all(i.startswith("^") for i in node.input)
            and bool(node.input))


def _classify(name, node, nbytes, gradient_sizes, weights_on,
              optimizer_scopes):
    """The kind of a transfer, from the op that produced the sent tensor."""
    if node is not None and node.op in VARIABLE_READ_OPS:
        return "weights"
    if any(name.startswith(scope + "/") or f"/{scope}/" in name
           for scope in optimizer_scopes):
        return "gradients"
    if not _is_backward(name):
        return "activations"
    # A backward tensor arriving where weights live, of a weight's size.
    if weights_on and nbytes in gradient_sizes:
        return "gradients"
    return "activation gradients"


def step_transfers(partition_nodes, sizes_by_op, gradient_sizes=(),
                   weight_devices=(), optimizer_scopes=(), host=None):
    """The device-to-device transfers of one executed step.

    Args:
        partition_nodes: `(device, NodeDef)` pairs of the step's partition
            graphs (`multigpu.placement.executed_node_defs`).
        sizes_by_op: Recorded tensor sizes (`recorded_tensor_sizes`) of the
            same step.
        gradient_sizes: Byte sizes of the model's trainable weights: a
            backward tensor of one of these sizes sent to a device that
            holds weights is counted as a weight gradient.
        weight_devices: Devices that hold the model's weights.
        optimizer_scopes: Name scopes of the optimizer's ops (its name):
            their tensors sent to another device are weight updates,
            counted with the gradients they are computed from.
        host: The device inputs come from (e.g. `"/device:CPU:0"`): a
            step argument that is already on another device was copied
            there from `host` before the step, and is counted as such.

    Returns:
        A list of `Transfer(source, destination, kind, tensor, bytes)`;
        a collective op gives one transfer per ring neighbour, of the ring
        algorithm's bytes.
    """
    graph = _Graph(partition_nodes)
    branch_sends = set()
    gradient_sizes = set(gradient_sizes)
    weight_devices = set(weight_devices)
    transfers = []
    collectives = []
    for device, node in partition_nodes:
        if node.op in SEND_OPS:
            source = short_device_name(node.attr["send_device"].s.decode())
            destination = short_device_name(node.attr["recv_device"].s.decode())
            if source == destination:
                continue
            tensor = node.input[0]
            if _is_control(graph.node.get(tensor.split(":")[0])):
                continue
            nbytes = graph.size(tensor, sizes_by_op)
            found = graph.producer(tensor)
            origin = found.options[0] if isinstance(found, _Merged) else found
            branch = _BRANCH.search(tensor)
            if branch:
                # One branch of a lowered conditional runs; a tensor sent
                # into both is moved once (the other send carries no data).
                key = (tensor[: branch.start()], origin[:2], destination)
                if key in branch_sends:
                    continue
                branch_sends.add(key)
            kind = _classify(origin[0], origin[2], nbytes, gradient_sizes,
                             destination in weight_devices, optimizer_scopes)
            transfers.append(Transfer(source, destination, kind,
                                      tensor.split(":")[0], nbytes))
        elif node.op in COLLECTIVE_OPS:
            collectives.append((device, node))
        elif (node.op == "_Arg" and host is not None and device != host
              and _arg_size(node)):
            # An input the caller (tf.distribute's input pipeline) placed
            # on this device before the step: copied from the host.
            transfers.append(Transfer(host, device, "activations", node.name,
                                      _arg_size(node)))
    return transfers + _ring_transfers(collectives, graph, sizes_by_op)


def _ring_transfers(collectives, graph, sizes_by_op):
    """Collectives' traffic, as the ring algorithm moves it.

    The devices that run collective ops in the step form the ring (one
    group, as under `MirroredStrategy`), in device-name order; each
    collective op on a device sends `2 (n - 1) / n` of its tensor to the
    next device.
    """
    ring = sorted({device for device, _ in collectives})
    n = len(ring)
    transfers = []
    for device, node in collectives:
        if n < 2:
            continue
        # The reduced output has the input's shape, and its recorded name is
        # the collective's own: an input's name may be shared with another
        # op in another replica's part of the traced step.
        nbytes = _recorded_size(node.name, 0, sizes_by_op)
        if nbytes is None:
            nbytes = graph.size(node.input[0], sizes_by_op)
        transfers.append(Transfer(
            device, ring[(ring.index(device) + 1) % n], "all-reduce",
            node.name,
            None if nbytes is None else ring_allreduce_bytes(nbytes, n),
        ))
    return transfers


def environment_note():
    """What the counted transfers mean on this machine's devices."""
    if tf.config.list_logical_devices("GPU"):
        return ("transfers: tensors TensorFlow sent between devices in the "
                "step (partition graphs' _Send/_Recv, collectives' ring "
                "traffic), sized by the debugger's record of the step")
    return ("transfers: tensors TensorFlow sent between devices in the step "
            "(partition graphs' _Send/_Recv, collectives' ring traffic); "
            "between logical CPU devices a transfer passes a reference, no "
            "byte is copied, but on GPUs each is a copy of this size")

