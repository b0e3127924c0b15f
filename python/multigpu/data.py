"""Input pipelines batched at the global batch size, as distributed training wants.

`distributed_dataset` applies the `tf.data` advice of Keras's distributed
training guide in one call: batch at the GLOBAL batch size
(`per_replica_batch_size * replicas`), optionally `cache()` (in memory or to
a file), `shuffle`, `prefetch(AUTOTUNE)`, and set the auto-shard policy that
multi-worker strategies use to split the data between workers.
"""

import os
import warnings

import keras
import numpy as np
import tensorflow as tf
from multigpu.messages import api, literal, literals, setting

_SHARD_POLICIES = {
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}
_BATCHED = ("_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset")


def num_replicas(strategy=None):
    """Number of replicas one global batch is split between.

    Args:
        strategy: A `tf.distribute.Strategy`; a model made by
            `multi_gpu_model` (anything with a `devices` list); or None for
            the strategy whose scope is open (one replica outside any scope).

    Returns:
        An int >= 1.

    Raises:
        TypeError: if `strategy` is none of the above.
    """
    if strategy is None:
        return tf.distribute.get_strategy().num_replicas_in_sync
    if isinstance(strategy, tf.distribute.Strategy):
        return strategy.num_replicas_in_sync
    devices = getattr(strategy, "devices", None)
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    raise TypeError(
        f"Invalid `strategy`: received an object of type "
        f"{type(strategy).__name__}; expected {literal(None)} (the strategy whose scope "
        "is open), a tf.distribute.Strategy such as "
        f"{api('mirrored_strategy')}, or a model made by "
        f"{api('multi_gpu_model', '...')}."
    )


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (
        value < 1
    ):
        raise ValueError(
            f"Invalid `{name}`: received {literal(value)}; expected an int >= 1."
        )
    return int(value)


def _rows(arrays):
    counts = {int(np.shape(a)[0]) for a in keras.tree.flatten(arrays)}
    if len(counts) != 1:
        raise ValueError(
            f"Invalid `x`/`y`: their arrays have different numbers of rows "
            f"{sorted(counts)}; every array needs one row per example."
        )
    return counts.pop()


def _from_arrays(x, y):
    if isinstance(x, tf.data.Dataset):
        if y is not None:
            raise ValueError(
                "Invalid `y`: received an array but `x` is a tf.data.Dataset, "
                f"which must yield (features, targets) itself; pass {setting('y', None)}."
            )
        if type(x).__name__ in _BATCHED:
            raise ValueError(
                "Invalid `x`: received a dataset that is already batched. "
                "distributed_dataset batches at the global batch size itself: "
                "pass the dataset of single examples (drop its .batch(), or "
                "call .unbatch() on it)."
            )
        cardinality = int(x.cardinality())
        return x, cardinality if cardinality >= 0 else None
    if x is None:
        raise ValueError(
            f"Invalid `x`: received {literal(None)}; expected numpy arrays (or a dict or "
            "list of them) or a tf.data.Dataset of single examples."
        )
    arrays = x if y is None else (x, y)
    rows = _rows(arrays)
    return tf.data.Dataset.from_tensor_slices(arrays), rows


def _cached(dataset, cache):
    if cache is None:
        return dataset
    if cache == "memory":
        return dataset.cache()
    if isinstance(cache, (str, os.PathLike)):
        path = os.fspath(cache)
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ValueError(
                f"Invalid `cache`: received {literal(cache)}, but its directory "
                f"{literal(parent)} does not exist. Create it first, or use "
                f"{setting('cache', 'memory')}."
            )
        return dataset.cache(path)
    raise ValueError(
        f"Invalid `cache`: received {literal(cache)}; expected {literal(None)} (no cache), "
        f"{literal('memory')}, or a file path prefix for an on-disk cache."
    )


def _shuffled(dataset, rows, shuffle, shuffle_buffer, seed):
    if not isinstance(shuffle, bool):
        raise ValueError(
            f"Invalid `shuffle`: received {literal(shuffle)}; expected {literals([True, False])}."
        )
    if not shuffle:
        return dataset
    if shuffle_buffer is None:
        if rows is None:
            raise ValueError(
                f"Invalid `shuffle_buffer`: received {literal(None)}, but the dataset's "
                "size is unknown (or infinite), so no full-shuffle buffer "
                f"size can be chosen. Pass {setting('shuffle_buffer', 10000)} (for example)."
            )
        shuffle_buffer = max(rows, 1)
    shuffle_buffer = _check_positive_int("shuffle_buffer", shuffle_buffer)
    return dataset.shuffle(
        shuffle_buffer, seed=seed, reshuffle_each_iteration=True
    )


def _global_batch(per_replica, replicas, rows):
    """The global batch size: a multiple of `replicas` that fits the data.

    Keras builds a model from the first batch by averaging it over replicas,
    which fails unless that batch splits evenly, so when the data has fewer
    rows than one global batch the batch is cut to the largest multiple of
    `replicas` that fits (no row is lost: the rest forms a final batch).
    """
    batch = per_replica * replicas
    if rows is None or rows >= batch:
        return batch
    if rows < replicas:
        warnings.warn(
            f"The data has only {rows} row(s), fewer than the {replicas} "
            "replicas: some replicas get an empty batch and Keras's "
            "model.fit cannot build the model from it under a "
            "MirroredStrategy. Use more data or fewer devices.",
            UserWarning, stacklevel=3,
        )
        return batch
    fitted = rows - rows % replicas
    warnings.warn(
        f"The data has {rows} rows, fewer than one global batch "
        f"({per_replica} per replica x {replicas} replicas = {batch}): "
        f"batching at {fitted} rows ({fitted // replicas} per replica) so the "
        "first batch splits evenly between replicas"
        + (f"; the other {rows % replicas} row(s) form a final batch."
           if rows % replicas else "."),
        UserWarning, stacklevel=3,
    )
    return fitted


def _warn_small_remainder(rows, batch, replicas, drop_remainder):
    remainder = 0 if rows is None or drop_remainder else rows % batch
    if 0 < remainder < replicas and rows > batch:
        warnings.warn(
            f"The final batch has {remainder} row(s), fewer than the "
            f"{replicas} replicas: {replicas - remainder} replica(s) get an "
            f"empty sub-batch in that step. Pass {setting('drop_remainder', True)} to skip "
            "it, or a per_replica_batch_size that divides the data.",
            UserWarning, stacklevel=3,
        )


def distributed_dataset(
    x,
    y=None,
    per_replica_batch_size=64,
    strategy=None,
    shuffle=False,
    shuffle_buffer=None,
    seed=None,
    cache=None,
    prefetch=True,
    shard_policy="data",
    drop_remainder=False,
):
    """A `tf.data` pipeline batched at the global batch size.

    The pipeline is: examples -> `cache()` -> `shuffle` -> `batch(global)` ->
    auto-shard option -> `prefetch(AUTOTUNE)`, with the global batch size
    `per_replica_batch_size * replicas`. Pass the result to `model.fit` under
    a strategy's scope, to a model from `multi_gpu_model`, or to
    `fit_distributed`.

    Args:
        x: Numpy arrays (one, or a list/tuple/dict of them), or a
            `tf.data.Dataset` of single (unbatched) examples, e.g. yielding
            `(features, target)` pairs.
        y: Target arrays for array `x`; None for a dataset `x`.
        per_replica_batch_size: Rows each replica processes per step.
        strategy: The strategy that will train on the data (its
            `num_replicas_in_sync` sets the global batch); a model from
            `multi_gpu_model` (its number of devices); or None for the
            strategy whose scope is open (one replica outside any scope).
            Under `MultiWorkerMirroredStrategy` the replicas of every worker
            count.
        shuffle: Shuffle the examples anew every epoch.
        shuffle_buffer: Shuffle buffer size; None for the whole data (its
            size must then be known).
        seed: Shuffle seed, for reproducible orders.
        cache: None; `"memory"` to keep the examples in memory after the
            first epoch; or a file path prefix for an on-disk cache (for data
            read from slow or remote storage).
        prefetch: Prepare the next batches while the current one trains
            (`prefetch(tf.data.AUTOTUNE)`).
        shard_policy: How multi-worker training splits the data between
            workers: `"data"` (every worker reads everything and keeps its
            share of the batches; right for in-memory data), `"file"`
            (workers read different files), `"auto"` or `"off"`.
        drop_remainder: Drop the final batch when it is smaller than the
            global batch.

    Returns:
        A `tf.data.Dataset` of global batches.

    Raises:
        ValueError: for invalid arguments; the message names the argument.
        TypeError: for an unsupported `strategy`.

    Example:
    >>> strategy = multigpu.mirrored_strategy()       # 4 replicas
    >>> data = multigpu.distributed_dataset(
    ...     x, y, per_replica_batch_size=64, strategy=strategy,
    ...     shuffle=True, cache="memory")             # batches of 256
    >>> model.fit(data, epochs=10)
    """
    per_replica = _check_positive_int(
        "per_replica_batch_size", per_replica_batch_size
    )
    policy = _SHARD_POLICIES.get(shard_policy) if isinstance(
        shard_policy, str) else None
    if policy is None:
        raise ValueError(
            f"Invalid `shard_policy`: received {literal(shard_policy)}; expected "
            f"one of {literals(list(_SHARD_POLICIES))}."
        )
    for name, flag in (("prefetch", prefetch),
                       ("drop_remainder", drop_remainder)):
        if not isinstance(flag, bool):
            raise ValueError(
                f"Invalid `{name}`: received {literal(flag)}; expected {literals([True, False])}."
            )
    replicas = num_replicas(strategy)
    if shuffle is True and seed is None and isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    ):
        warnings.warn(
            f"{setting('shuffle', True)} without a seed under MultiWorkerMirroredStrategy: "
            "each worker shuffles differently and keeps its share of a "
            "different order, so some rows are seen twice per epoch and "
            "others never. Pass the same seed on every worker.",
            UserWarning, stacklevel=2,
        )
    dataset, rows = _from_arrays(x, y)
    dataset = _cached(dataset, cache)
    dataset = _shuffled(dataset, rows, shuffle, shuffle_buffer, seed)
    batch = _global_batch(per_replica, replicas, rows)
    _warn_small_remainder(rows, batch, replicas, drop_remainder)
    dataset = dataset.batch(batch, drop_remainder=drop_remainder)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    dataset = dataset.with_options(options)
    if prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return dataset
