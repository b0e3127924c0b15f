"""Observing where TensorFlow really ran the ops of a step.

Device scopes are requests; the placer decides. This module reads the
partition graphs TensorFlow executed (run metadata), one per device, so tests
and reports state what ran where rather than what was asked for.
"""

import collections

from tensorflow.python.eager import context


def executed_ops(fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` and counts the ops each device executed.

    Only ops of compiled functions (`tf.function`, and so Keras `fit`,
    `predict`, `evaluate` steps) are seen; eager ops are not.

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
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        result = fn(*args, **kwargs)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    counts = collections.Counter()
    for function_graph in metadata.function_graphs:
        for partition in function_graph.partition_graphs:
            for node in partition.node:
                device = "/device:" + node.device.rsplit("/device:", 1)[-1]
                counts[(device, node.op)] += 1
    return result, counts


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
