"""Custom gradients that live as long as their graph, not as long as the process.

`tf.custom_gradient` in a graph (every `tf.function` trace) registers the
call's gradient function in TensorFlow's process-wide gradient registry
under a new name (`CustomGradient-<uid>`) and never removes it; the entry
holds the traced graph and its variables. Every build of a model whose
train step uses custom gradients (`multi_gpu_model`'s replicas, and
`ReplicaContext.all_reduce` under a strategy) therefore keeps megabytes
alive for the rest of the process. `gradients_owned_by_ops()` moves the
entries created while tracing onto the operations they belong to
(`Operation._gradient_function`, which `tf.gradients` consults before the
registry), so they are freed with their graph.
"""

import contextlib

import tensorflow as tf

from multigpu import tensorflow_internals

_OVERRIDE_ATTRIBUTE = "_gradient_op_type"


def _gradient_name(op):
    try:
        name = op.get_attr(_OVERRIDE_ATTRIBUTE)
    except ValueError:
        return None
    return name.decode() if isinstance(name, bytes) else name


@contextlib.contextmanager
def gradients_owned_by_ops():
    """Moves gradient functions registered in this block onto their ops.

    Use around code traced into a graph (inside a `tf.function`). Ops of the
    current graph whose custom gradient was registered in the block get the
    function as their own; the registry entry is removed. Entries whose op
    is not in the current graph (nested function graphs) stay registered.

    Example:
    >>> @tf.function
    ... def step(x):
    ...     with gradients_owned_by_ops():
    ...         return model_step(x)
    """
    before = tensorflow_internals.registered_gradient_names()
    yield
    if tf.executing_eagerly():
        return
    new = tensorflow_internals.registered_gradient_names() - before
    if not new:
        return
    for op in tf.compat.v1.get_default_graph().get_operations():
        name = _gradient_name(op)
        if name in new:
            tensorflow_internals.move_gradient_to_op(op, name)
            new.discard(name)
