"""Decisions every worker of a job of several processes takes together.

On TensorFlow the workers are those of a `MultiWorkerMirroredStrategy`; on
JAX, the processes JAX joined (`multigpu.engines.jax.processes`), which
agree through the backend's runtime (`process_agreement`). This module
imports neither framework until one of them runs, so that the checkpoints
that ask it run on JAX without TensorFlow.
"""

import functools

from multigpu import runtime
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


def agreement(strategy):
    """How the workers training under `strategy` agree on a flag, or None.

    Args:
        strategy: The model's `distribute_strategy` (None on JAX).

    Returns:
        A function of this worker's bool returning whether any worker's is
        true (`any_worker` over the strategy, or the runtime's
        `process_agreement`: on JAX, `multigpu.runtime.jax.any_process`),
        or None when this process trains alone.

    Example:
    >>> agree = agreement(model.distribute_strategy)
    >>> stop = agree(caught) if agree else caught
    """
    if spans_workers(strategy):
        return functools.partial(any_worker, strategy)
    return runtime.of_backend().process_agreement()
