"""Decisions every worker of a multi-worker strategy takes together.

Only a TensorFlow strategy spans workers; this module imports no
TensorFlow, so that the checkpoints that ask it run on JAX without it.
"""

from multigpu.runtime import loaded_tensorflow


def spans_workers(strategy):
    """Whether `strategy` trains across more than one worker process.

    Args:
        strategy: A `tf.distribute.Strategy`, or None.

    Returns:
        True for a `MultiWorkerMirroredStrategy` whose cluster has two or
        more tasks; False otherwise.

    Example:
    >>> spans_workers(tf.distribute.MirroredStrategy())
    False
    """
    tf = loaded_tensorflow()  # a strategy exists only once it is imported
    if tf is None or not isinstance(
            strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    resolver = strategy.cluster_resolver
    jobs = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return sum(len(tasks) for tasks in jobs.values()) > 1


def any_worker(strategy, flag):
    """Whether `flag` is true on any worker; every worker must call it.

    One all-reduce of a number across the cluster, so it also keeps the
    workers in step: none returns before every worker has called it.

    Args:
        strategy: The `MultiWorkerMirroredStrategy` the workers train under.
        flag: This worker's bool.

    Returns:
        A bool, the same on every worker.

    Example:
    >>> stop = any_worker(strategy, signal_arrived)
    """
    tf = loaded_tensorflow()  # imported: the strategy is TensorFlow's
    per_replica = strategy.run(lambda: tf.constant(1.0 if flag else 0.0))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return bool(total.numpy() > 0)
