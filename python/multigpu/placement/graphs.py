"""Graph capture: the ops and weights TensorFlow really placed on each device.

Device scopes are requests; the placer decides. These functions read the
partition graphs TensorFlow executed (run metadata), one per device, and the
devices of a model's variables, so tests and reports state what ran where
rather than what was asked for.
"""

import collections

from multigpu import tensorflow_internals
from multigpu.devices import short_device_name
from multigpu.messages import literal
from multigpu.variables import variable_bytes, variable_components

# Nodes that move data, route it through lowered control flow, or mark
# function boundaries rather than compute.
PLUMBING_OPS = frozenset({
    "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval", "NoOp",
    "_Send", "_Recv", "_HostSend", "_HostRecv",
    "Switch", "Merge", "Identity",
})

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
    ctx = tensorflow_internals.eager_context()
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
