"""Input pipelines batched at the global batch size, as distributed training wants.

`distributed_dataset` applies the `tf.data` advice of Keras's distributed
training guide in one call: batch at the GLOBAL batch size
(`per_replica_batch_size * replicas`), optionally `cache()` (in memory or to
a file), `shuffle`, `prefetch(AUTOTUNE)`, and set the auto-shard policy that
multi-worker strategies use to split the data between workers.
"""

import difflib
import os
import warnings

import keras
import numpy as np
import tensorflow as tf

from multigpu import backends
from multigpu.arguments import check_flag, check_int, is_int
from multigpu.checkpoints.epochs import EPOCH_CLOCK_ATTRIBUTE, EpochClock
from multigpu.inputs import check_no_r_na, check_numeric_y
from multigpu.messages import api, current_language, literal, literals, setting

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


def _rows(arrays):
    counts = {int(np.shape(a)[0]) for a in keras.tree.flatten(arrays)}
    if len(counts) != 1:
        raise ValueError(
            f"Invalid `x`/`y`: their arrays have different numbers of rows "
            f"{sorted(counts)}; every array needs one row per example."
        )
    return counts.pop()


def _several_arrays(value):
    """A list of arrays as a tuple: `from_tensor_slices` would stack a list
    into one tensor (`[x1, x2]` of 16 rows each became 2 rows)."""
    if isinstance(value, list) and value and all(
            isinstance(v, (np.ndarray, tf.Tensor, dict)) for v in value):
        return tuple(value)
    return value


def _check_not_scalar(name, value):
    """Refuses a scalar (a number, a string) where arrays of rows belong."""
    if value is None:
        return
    scalars = [v for v in keras.tree.flatten(value) if np.ndim(v) == 0]
    if scalars:
        shown = scalars[0]
        shown = (literal(shown) if isinstance(shown, (str, bool, int, float))
                 else f"a scalar of type {type(shown).__name__}")
        raise ValueError(
            f"Invalid `{name}`: received {shown}, which has no rows; expected "
            "numpy arrays (or a dict or list of them) with one row per "
            "example"
            + (", or a tf.data.Dataset of single examples." if name == "x"
               else ".")
        )


def _leaf_name(name, path):
    """`x['a']`, `y[0]`: a leaf of a nested argument, in the user's language."""
    if current_language() == "r":
        keys = [k + 1 if isinstance(k, int) else k for k in path]
        return name + "".join(f"[[{literal(k)}]]" for k in keys)
    return name + "".join(f"[{literal(k)}]" for k in path)


def _nonfinite_report(array):
    """`(NaN count, inf count, rows holding one, first bad index)`, or None."""
    if array.dtype.kind not in "fc" or array.ndim == 0:
        return None
    bad = ~np.isfinite(array)
    if not bad.any():
        return None
    nan = int(np.isnan(array).sum())
    rows = int(bad.reshape(len(array), -1).any(axis=1).sum())
    return nan, int(bad.sum()) - nan, rows, tuple(np.argwhere(bad)[0])


def _check_finite(name, value):
    """Refuses NaN and inf in in-memory training data, naming where.

    Keras trains on such data without an error and every weight becomes
    NaN in the first step that reads one, so it is refused before any
    training, as the engines' training step does for each batch.

    Raises:
        ValueError: naming the argument, the first bad row (and column) and
            the fix.
    """
    if value is None:
        return
    base = 1 if current_language() == "r" else 0
    for path, leaf in keras.tree.flatten_with_path(value):
        check_no_r_na(_leaf_name(name, path), leaf)
        report = _nonfinite_report(np.asarray(leaf))
        if report is None:
            continue
        nan, inf, rows, first = report
        counts = " and ".join(f"{n} {kind}" for n, kind in
                              ((nan, "NaN"), (inf, "inf")) if n)
        where = f"row {first[0] + base}"
        if len(first) == 2:
            where += f", column {first[1] + base}"
        elif len(first) > 2:
            where += f", position {[i + base for i in first[1:]]} in that row"
        raise ValueError(
            f"Invalid `{_leaf_name(name, path)}`: received {counts} "
            f"value{'s' if nan + inf > 1 else ''} in {rows} "
            f"row{'s' if rows > 1 else ''}, the first in {where} (counted "
            f"from {base}). Trained on, a NaN or inf turns every weight into "
            "NaN without an error. Remove or replace those rows (e.g. "
            "impute missing values) before calling "
            f"{api('distributed_dataset', 'x, y, ...')}."
        )


def _check_dataset_targets(dataset):
    """Refuses a dataset of `(features, targets)` whose targets are strings."""
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) < 2:
        return
    if any(s.dtype == tf.string for s in keras.tree.flatten(spec[1])
           if isinstance(s, tf.TensorSpec)):
        raise ValueError(
            "Invalid `x`: received a tf.data.Dataset whose targets (the "
            "second element of each example) are strings; losses compute on "
            "numbers. Map each class to an integer index from 0 first, e.g. "
            "with dataset.map() and a keras.layers.StringLookup.")


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
        _check_dataset_targets(x)
        cardinality = int(x.cardinality())
        if cardinality == 0:
            raise ValueError(
                "Invalid `x`: received an empty tf.data.Dataset; expected "
                "at least one example."
            )
        return x, cardinality if cardinality >= 0 else None
    if x is None:
        raise ValueError(
            f"Invalid `x`: received {literal(None)}; expected numpy arrays (or a dict or "
            "list of them) or a tf.data.Dataset of single examples."
        )
    x, y = _several_arrays(x), _several_arrays(y)
    _check_not_scalar("x", x)
    _check_not_scalar("y", y)
    check_numeric_y("y", y)
    _check_finite("x", x)
    _check_finite("y", y)
    arrays = x if y is None else (x, y)
    rows = _rows(arrays)
    if rows == 0:
        raise ValueError(
            "Invalid `x`: received arrays of 0 rows; expected at least one "
            "example (training on no data has no batches to run)."
        )
    return tf.data.Dataset.from_tensor_slices(arrays), rows


def _looks_like_memory(cache):
    """Whether a bare name (no directory) is "memory" mistyped: `"Memory"`,
    `"memroy"`, `"memmory"` would otherwise name cache files in the
    working directory."""
    if os.path.dirname(cache) or os.path.splitext(cache)[1]:
        return False
    name = cache.strip().lower()
    return name == "memory" or bool(
        difflib.get_close_matches(name, ["memory"], n=1, cutoff=0.75))


def _check_cache(cache):
    """`cache` as `None`, `"memory"` or a file path prefix (a str).

    `True`/`False` are accepted as `"memory"`/`None` (R's `TRUE`/`FALSE`).
    """
    if cache is None or cache is False or (
            isinstance(cache, np.bool_) and not cache):
        return None
    if cache is True or isinstance(cache, np.bool_):
        return "memory"
    if isinstance(cache, str) and cache == "memory":
        return cache
    expected = (f"expected {literals([None, False])} (no cache), "
                f"{literals(['memory', True])} (in memory), or a file path "
                f"prefix for an on-disk cache, e.g. {literal('./cache/train')}")
    if not isinstance(cache, (str, os.PathLike)):
        raise ValueError(
            f"Invalid `cache`: received {literal(cache)}; {expected}.")
    path = os.fspath(cache)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(
            f"Invalid `cache`: received {literal(cache)}; {expected}.")
    if _looks_like_memory(path):
        raise ValueError(
            f"Invalid `cache`: received {literal(cache)}; expected "
            f"{literal('memory')} or a file path prefix. Did you mean "
            f"{literal('memory')} (an in-memory cache)? For cache "
            f"files named {literal(path)}, give a path with a directory, e.g. "
            f"{literal(os.path.join('.', path))}."
        )
    if os.path.isdir(path):
        raise ValueError(
            f"Invalid `cache`: received {literal(cache)}, which is a "
            "directory; the cache is a file path prefix (TensorFlow adds "
            ".index and .data-* to it), e.g. "
            f"{literal(os.path.join(path, 'cache'))}."
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(
            f"Invalid `cache`: received {literal(cache)}, but its directory "
            f"{literal(parent)} does not exist. Create it first, or use "
            f"{setting('cache', 'memory')}."
        )
    return path


def _cached(dataset, cache):
    if cache is None:
        return dataset
    if cache == "memory":
        return dataset.cache()
    return dataset.cache(cache)


def _check_seed(seed):
    if seed is None:
        return None
    if is_int(seed):
        return int(seed)
    raise ValueError(
        f"Invalid `seed`: received {literal(seed)}; expected "
        f"{literal(None)} (a new order every run) or an int (the same "
        "orders in every run, and in a resumed run)."
    )


def _shuffled(dataset, rows, shuffle, shuffle_buffer, seed, clock):
    shuffle = check_flag("shuffle", shuffle)
    seed = _check_seed(seed)
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
    shuffle_buffer = check_int("shuffle_buffer", shuffle_buffer, 1)
    if seed is None:
        return dataset.shuffle(shuffle_buffer, reshuffle_each_iteration=True)
    return _epoch_keyed_shuffle(dataset, rows, shuffle_buffer, seed, clock)


def _epoch_keyed_shuffle(dataset, rows, buffer, seed, clock):
    """A shuffle whose order in epoch e depends on (seed, e) only.

    `clock` (the dataset's `EpochClock`) says which epoch an iteration is
    when it starts: the one the training loop announced, or else the count
    of this dataset's iterations (every iteration reshuffles, as
    `reshuffle_each_iteration=True` does).
    """

    def epoch_seed():
        epoch = clock.next_epoch()
        return np.int64(hash((seed, epoch)) & 0x7FFFFFFFFFFFFFFF)

    def one_epoch(_):
        # Traced in a function graph that inherits the global seed; the
        # order must depend on `seed` and the epoch only, not on whether
        # the program set a global seed before making the dataset.
        tf.compat.v1.get_default_graph().seed = None
        epoch_op_seed = tf.py_function(epoch_seed, [], tf.int64)
        epoch_op_seed.set_shape([])
        return dataset.shuffle(buffer, seed=epoch_op_seed,
                               reshuffle_each_iteration=False)

    shuffled = tf.data.Dataset.from_tensors(np.int64(0)).flat_map(one_epoch)
    if rows is not None:
        shuffled = shuffled.apply(tf.data.experimental.assert_cardinality(rows))
    return shuffled


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


def _warn_uneven_final_batch(rows, batch, replicas, drop_remainder,
                             strategy):
    """Warns when a strategy's final batch weights its rows unequally.

    Under a `tf.distribute` strategy every replica averages the loss over
    its own rows and the replicas' averages are averaged, so a final batch
    that does not split evenly gives some rows more weight than others:
    Keras's `fit` differs from one device on the same batches.
    (`multi_gpu_model` and `fit_distributed` weigh every row alike.)
    """
    if rows is None or drop_remainder or replicas < 2 or not isinstance(
            strategy, tf.distribute.Strategy):
        return
    remainder = rows % batch
    if remainder == 0 or remainder % replicas == 0 or remainder < replicas:
        return
    warnings.warn(
        f"The final batch has {remainder} rows, which do not split evenly "
        f"between the {replicas} replicas: each replica averages the loss of "
        "its own rows, so under Keras's model.fit some rows weigh more than "
        "others in that step and the weights differ from single-device "
        "training on the same batches. Batch with "
        f"{setting('drop_remainder', True)}, or pass a number "
        "of rows that splits evenly, or train with "
        f"{api('fit_distributed', 'model, data')} or "
        f"{api('multi_gpu_model', 'model')}, which are exact on any batch.",
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
        seed: Shuffle seed, for reproducible orders: epoch e is then
            shuffled by (seed, e) only. The dataset owns the count of its
            epochs (`epochs.epoch_clock`); give it to
            `checkpoint_callbacks(..., data=...)` and a resumed run replays
            the interrupted epoch's order exactly.
        cache: None (or False); `"memory"` (or True) to keep the examples
            in memory after the first epoch; or a file path prefix for an
            on-disk cache (for data read from slow or remote storage), e.g.
            `"./cache/train"`. A bare name close to `"memory"` (`"memroy"`)
            is refused as a typo, and so is a directory.
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
            In-memory `x` and `y` are checked before any training: NaN or
            inf values (named by row and column) and string targets are
            refused, as they would train silently into NaN weights or fail
            inside TensorFlow.
        TypeError: for an unsupported `strategy`.

    Example:
    >>> strategy = multigpu.mirrored_strategy()       # 4 replicas
    >>> data = multigpu.distributed_dataset(
    ...     x, y, per_replica_batch_size=64, strategy=strategy,
    ...     shuffle=True, cache="memory")             # batches of 256
    >>> model.fit(data, epochs=10)
    """
    backends.require_backend(
        "distributed_dataset", "a tf.distribute strategy, whose replicas "
        "set the global batch size and shard the tf.data pipeline")
    per_replica = check_int(
        "per_replica_batch_size", per_replica_batch_size, 1)
    policy = _SHARD_POLICIES.get(shard_policy) if isinstance(
        shard_policy, str) else None
    if policy is None:
        raise ValueError(
            f"Invalid `shard_policy`: received {literal(shard_policy)}; expected "
            f"one of {literals(list(_SHARD_POLICIES))}."
        )
    prefetch = check_flag("prefetch", prefetch)
    drop_remainder = check_flag("drop_remainder", drop_remainder)
    cache = _check_cache(cache)
    if shuffle_buffer is not None:
        check_int("shuffle_buffer", shuffle_buffer, 1)
    replicas = num_replicas(strategy)
    shuffle = check_flag("shuffle", shuffle)
    if shuffle and seed is None and isinstance(
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
    clock = EpochClock()
    dataset = _shuffled(dataset, rows, shuffle, shuffle_buffer, seed, clock)
    batch = _global_batch(per_replica, replicas, rows)
    _warn_small_remainder(rows, batch, replicas, drop_remainder)
    _warn_uneven_final_batch(rows, batch, replicas, drop_remainder,
                             strategy or tf.distribute.get_strategy())
    dataset = dataset.batch(batch, drop_remainder=drop_remainder)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    dataset = dataset.with_options(options)
    if prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    if shuffle and seed is not None:
        setattr(dataset, EPOCH_CLOCK_ATTRIBUTE, clock)
    return dataset
