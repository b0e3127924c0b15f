"""distributed_dataset: global batches, cache, shuffle, prefetch, shard policy."""

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from support.models import copy_of, data, mlp


def _batches(dataset):
    return [tuple(np.asarray(t) for t in batch) for batch in dataset]


def _rows(dataset):
    return np.concatenate([b[0] for b in _batches(dataset)])


def test_batches_at_the_global_batch_size_without_losing_rows(rng):
    x, y = data(rng, 100)
    strategy = multigpu.mirrored_strategy(4)
    dataset = multigpu.distributed_dataset(x, y, per_replica_batch_size=8,
                                           strategy=strategy)
    sizes = [len(b[0]) for b in _batches(dataset)]
    assert sizes == [32, 32, 32, 4]
    np.testing.assert_array_equal(_rows(dataset), x)
    np.testing.assert_array_equal(
        np.concatenate([b[1] for b in _batches(dataset)]), y)


def test_strategy_none_uses_the_open_scope(rng):
    x, y = data(rng, 64)
    assert len(next(iter(multigpu.distributed_dataset(x, y, 8)))[0]) == 8
    with multigpu.mirrored_strategy(2).scope():
        assert len(next(iter(multigpu.distributed_dataset(x, y, 8)))[0]) == 16


def test_a_parallel_model_counts_its_devices(rng):
    x, y = data(rng, 64)
    parallel = multigpu.multi_gpu_model(mlp(), gpus=4)
    batch = next(iter(multigpu.distributed_dataset(x, y, 4,
                                                   strategy=parallel)))
    assert len(batch[0]) == 16


def test_dict_features_and_datasets_of_examples(rng):
    x, y = data(rng, 20)
    dataset = multigpu.distributed_dataset({"features": x}, y, 5,
                                           strategy=multigpu.mirrored_strategy(2))
    first = next(iter(dataset))
    assert first[0]["features"].shape == (10, 8)
    examples = tf.data.Dataset.from_tensor_slices((x, y))
    batches = multigpu.distributed_dataset(
        examples, per_replica_batch_size=5,
        strategy=multigpu.mirrored_strategy(2))
    np.testing.assert_array_equal(_rows(batches), x)


def test_less_data_than_one_global_batch_still_splits_evenly(rng):
    x, y = data(rng, 70)
    strategy = multigpu.mirrored_strategy(4)
    with pytest.warns(UserWarning, match=r"batching at 68 rows"):
        dataset = multigpu.distributed_dataset(x, y, 32, strategy=strategy)
    assert [len(b[0]) for b in _batches(dataset)] == [68, 2]
    with strategy.scope():  # Keras's fit fails on an uneven first batch
        model = mlp()
        model.compile(optimizer="sgd", loss="mse")
    reference = copy_of(model)
    reference.compile(optimizer="sgd", loss="mse")
    after_first = []
    watcher = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: after_first.append(
            model.get_weights()) if batch == 0 else None)
    history = model.fit(dataset, epochs=1, verbose=0, callbacks=[watcher])
    assert len(history.history["loss"]) == 1
    # The batch of 68 rows trains as on one device. The last 2 rows leave
    # two replicas without rows, which Keras's fit under a strategy weighs
    # unlike one device (distributed_dataset warns of it).
    reference.train_on_batch(x[:68], y[:68])
    for got, want in zip(after_first[0], reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_warns_when_a_batch_is_smaller_than_the_replica_count(rng):
    strategy = multigpu.mirrored_strategy(4)
    with pytest.warns(UserWarning, match=r"only 3 row\(s\), fewer than the 4"):
        multigpu.distributed_dataset(*data(rng, 3), 8, strategy=strategy)
    with pytest.warns(UserWarning, match=r"final batch has 2 row\(s\)"):
        multigpu.distributed_dataset(*data(rng, 66), 8, strategy=strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = multigpu.distributed_dataset(*data(rng, 66), 8,
                                               strategy=strategy,
                                               drop_remainder=True)
    assert [len(b[0]) for b in _batches(dataset)] == [32, 32]


def test_shuffle_is_a_seeded_permutation_redrawn_every_epoch(rng):
    x, y = data(rng, 64)
    make = lambda seed: multigpu.distributed_dataset(  # noqa: E731
        x, y, 8, strategy=multigpu.mirrored_strategy(2), shuffle=True,
        seed=seed)
    dataset = make(3)
    first, second = _rows(dataset), _rows(dataset)
    assert not np.array_equal(first, x)
    assert not np.array_equal(first, second)
    assert sorted(map(tuple, first)) == sorted(map(tuple, x))
    np.testing.assert_array_equal(_rows(make(3)), first)


def _counting(x):
    """A dataset of x's rows that counts how often its elements are made."""
    calls = tf.Variable(0)

    def count(row):
        calls.assign_add(1)
        return row

    return tf.data.Dataset.from_tensor_slices(x).map(count), calls


def test_memory_cache_computes_the_examples_once(rng):
    x, _ = data(rng, 12)
    examples, calls = _counting(x)
    dataset = multigpu.distributed_dataset(examples, per_replica_batch_size=3,
                                           strategy=multigpu.mirrored_strategy(2),
                                           cache="memory")
    _batches(dataset)
    _batches(dataset)
    assert int(calls.numpy()) == 12
    examples, calls = _counting(x)
    _batches(multigpu.distributed_dataset(examples, per_replica_batch_size=3))
    _batches(multigpu.distributed_dataset(examples, per_replica_batch_size=3))
    assert int(calls.numpy()) == 24


def test_file_cache_writes_the_examples_to_disk(rng, tmp_path):
    x, _ = data(rng, 12)
    path = str(tmp_path / "cache")
    dataset = multigpu.distributed_dataset(tf.data.Dataset.from_tensor_slices(x),
                                           per_replica_batch_size=4,
                                           cache=path)
    np.testing.assert_array_equal(np.concatenate(list(dataset)), x)
    assert any(name.startswith("cache") for name in os.listdir(tmp_path))


def test_prefetch_and_shard_policy_are_applied(rng):
    x, y = data(rng, 16)
    policy = tf.data.experimental.AutoShardPolicy
    for name, expected in (("data", policy.DATA), ("file", policy.FILE),
                           ("off", policy.OFF), ("auto", policy.AUTO)):
        dataset = multigpu.distributed_dataset(x, y, 4, shard_policy=name)
        assert dataset.options().experimental_distribute.auto_shard_policy \
            == expected
    assert type(multigpu.distributed_dataset(x, y, 4)).__name__ == \
        "_PrefetchDataset"
    assert type(multigpu.distributed_dataset(x, y, 4, prefetch=False)) \
        .__name__ != "_PrefetchDataset"


@pytest.mark.parametrize("kwargs, message", [
    ({"per_replica_batch_size": 0}, r"`per_replica_batch_size`: received 0"),
    ({"shard_policy": "rows"}, r"`shard_policy`: received 'rows'"),
    ({"cache": "/no/such/dir/cache"}, r"`cache`: received '/no/such/dir"),
    ({"cache": 3}, r"`cache`: received 3"),
    ({"shuffle": "yes"}, r"`shuffle`: received 'yes'"),
    ({"prefetch": 1}, r"`prefetch`: received 1"),
])
def test_invalid_arguments_are_named(rng, kwargs, message):
    x, y = data(rng, 8)
    with pytest.raises(ValueError, match=message):
        multigpu.distributed_dataset(x, y, **{"per_replica_batch_size": 2,
                                              **kwargs})


def test_invalid_inputs_are_named(rng):
    x, y = data(rng, 8)
    with pytest.raises(ValueError, match=r"different numbers of rows"):
        multigpu.distributed_dataset(x, y[:5])
    examples = tf.data.Dataset.from_tensor_slices((x, y))
    with pytest.raises(ValueError, match=r"`y`"):
        multigpu.distributed_dataset(examples, y)
    with pytest.raises(ValueError, match=r"already batched"):
        multigpu.distributed_dataset(examples.batch(4))
    with pytest.raises(ValueError, match=r"`shuffle_buffer`"):
        multigpu.distributed_dataset(examples.repeat(), shuffle=True)
    with pytest.raises(TypeError, match=r"`strategy`"):
        multigpu.distributed_dataset(x, y, strategy="mirrored")


def _fit_weights(model, dataset, epochs=2):
    model.fit(dataset, epochs=epochs, verbose=0)
    return model.get_weights()


def test_an_uneven_final_batch_under_a_strategy_warns_and_even_ones_are_exact(
        rng):
    """The warning's claim: 14 rows on 4 replicas differ, 16 rows do not."""
    x, y = data(rng, 16)
    strategy = multigpu.mirrored_strategy(4)
    results = {}
    for rows in (14, 16):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dataset = multigpu.distributed_dataset(x[:rows], y[:rows], 2,
                                                   strategy=strategy)
        uneven = [str(w.message) for w in caught
                  if "do not split evenly" in str(w.message)]
        assert len(uneven) == (1 if rows == 14 else 0)
        assert all("multigpu.multi_gpu_model(model)" in m for m in uneven)
        with strategy.scope():
            model = mlp()
            model.compile(optimizer="sgd", loss="mse")
        reference = mlp()
        reference.set_weights(model.get_weights())
        reference.compile(optimizer="sgd", loss="mse")
        got = _fit_weights(model, dataset)
        want = _fit_weights(reference, tf.data.Dataset.from_tensor_slices(
            (x[:rows], y[:rows])).batch(8))
        results[rows] = max(float(np.max(np.abs(a - b)))
                            for a, b in zip(got, want))
    assert results[16] < 1e-6
    assert results[14] > 1e-4


@pytest.mark.parametrize("kwargs, message", [
    ({"seed": "abc"}, r"`seed`: received 'abc'; expected None"),
    ({"seed": 1.5}, r"`seed`: received 1.5"),
    ({"cache": "Memory"}, r"`cache`: received 'Memory'; expected 'memory'"),
    ({"shuffle": np.int64(1)}, r"`shuffle`: received 1; expected True or"),
])
def test_unclear_inputs_get_named_errors(rng, kwargs, message):
    x, y = data(rng, 8)
    with pytest.raises(ValueError, match=message):
        multigpu.distributed_dataset(x, y, 2, **{"shuffle": True, **kwargs})


def test_zero_rows_are_refused_with_the_argument_named(rng):
    x, y = data(rng, 8)
    with pytest.raises(ValueError, match=r"`x`: received arrays of 0 rows"):
        multigpu.distributed_dataset(x[:0], y[:0], 2)
    empty = tf.data.Dataset.from_tensor_slices((x[:0], y[:0]))
    with pytest.raises(ValueError, match=r"`x`: received an empty"):
        multigpu.distributed_dataset(empty)


def test_numpy_scalars_are_accepted(rng):
    x, y = data(rng, 8)
    dataset = multigpu.distributed_dataset(
        x, y, np.int64(2), shuffle=np.bool_(True), seed=np.int64(3),
        prefetch=np.bool_(False), drop_remainder=np.bool_(True))
    assert sorted(map(tuple, _rows(dataset))) == sorted(map(tuple, x))


def test_a_seeded_order_depends_on_the_epoch_not_on_the_global_seed(rng):
    from multigpu.checkpoints import epochs
    x, y = data(rng, 32)
    orders = {}
    for global_seed in (1, 2):
        tf.random.set_seed(global_seed)
        dataset = multigpu.distributed_dataset(x, y, 4, shuffle=True, seed=5)
        for epoch in (0, 1):
            epochs.epoch_clock(dataset).announce(epoch)
            orders[global_seed, epoch] = _rows(dataset)
    np.testing.assert_array_equal(orders[1, 0], orders[2, 0])
    np.testing.assert_array_equal(orders[1, 1], orders[2, 1])
    assert not np.array_equal(orders[1, 0], orders[1, 1])


# In-memory data is checked before any training: NaN/inf and string targets
# trained silently into NaN weights or failed inside TensorFlow.
@pytest.mark.parametrize("where, message", [
    ("x", r"^Invalid `x`: received 1 NaN value in 1 row, the first in row 5, "
          r"column 2 \(counted from 0\)\..*NaN without an error\. Remove or "
          r"replace those rows .*multigpu\.distributed_dataset\("),
    ("y", r"^Invalid `y`: received 2 inf values in 1 row, the first in row 5"),
])
def test_nan_or_inf_in_memory_is_named_by_argument_row_and_column(
        rng, where, message):
    x, y = data(rng, 16)
    if where == "x":
        x[5, 2] = np.nan
    else:
        y[5, :2] = np.inf
    with pytest.raises(ValueError, match=message):
        multigpu.distributed_dataset(x, y, 4)


def test_nan_in_a_dict_of_inputs_names_the_input_and_r_counts_from_1(rng):
    from multigpu.messages import language
    x, y = data(rng, 16)
    x[3, 0] = np.nan
    with pytest.raises(ValueError, match=r"^Invalid `x\['a'\]`: .*row 3, column 0"):
        multigpu.distributed_dataset({"a": x}, y, 4)
    with language("r"), pytest.raises(
            ValueError, match=r'^Invalid `x\[\["a"\]\]`: .*row 4, column 1 '
                              r"\(counted from 1\).*distributed_dataset\(x, y"):
        multigpu.distributed_dataset({"a": x}, y, 4)


def test_nan_data_never_reaches_a_plain_fit_under_mirrored_strategy(rng):
    strategy = multigpu.mirrored_strategy(2)
    x, y = data(rng, 16)
    x[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"^Invalid `x`: received 1 NaN"):
        multigpu.distributed_dataset(x, y, 4, strategy=strategy)


@pytest.mark.parametrize("make", [
    lambda x: (x, np.array(list("abcd") * 4)),
    lambda x: (x, np.array(list("abcd") * 4, dtype=object)),
])
def test_string_labels_are_named_with_the_fix(rng, make):
    x, y = make(data(rng, 16)[0])
    with pytest.raises(ValueError, match=r"^Invalid `y`: received strings "
                       r".*integer index from 0"):
        multigpu.distributed_dataset(x, y, 4)


def test_a_dataset_of_string_targets_is_named_with_the_fix(rng):
    x, _ = data(rng, 16)
    examples = tf.data.Dataset.from_tensor_slices((x, np.array(list("ab") * 8)))
    with pytest.raises(ValueError, match=r"^Invalid `x`: .*targets .* are "
                       r"strings.*StringLookup"):
        multigpu.distributed_dataset(examples)


def test_string_features_and_finite_data_are_accepted(rng):
    x, y = data(rng, 16)
    names = np.array(["word"] * 16)
    dataset = multigpu.distributed_dataset((x, names), y, 4)
    assert int(dataset.cardinality()) == 4


def test_r_integer_na_is_named_na_not_its_int32_code(rng):
    from multigpu.messages import R_NA_INTEGER, language
    x, _ = data(rng, 16)
    labels = np.zeros(16, "int32")
    labels[[4, 9]] = R_NA_INTEGER
    with language("r"), pytest.raises(
            ValueError, match=r"^Invalid `y`: received NA in 2 of 16 rows "
                              r"\(the first is row 5\).*!is\.na\(y\)"):
        multigpu.distributed_dataset(x, labels, 4)
    # From Python the same int32 is a number like any other.
    multigpu.distributed_dataset(x, labels, 4)
