"""`model_parallel` on JAX: the weights split across devices, one device's numbers.

Each model is trained twice from the same weights: as a plain Keras model
on one device, and through `multigpu.model_parallel(devices=k)`, whose
weights XLA splits across k devices. Predictions before training,
the history of `fit` (42 rows in batches of 16: a last batch of 10),
`evaluate`, predictions after training and the trained weights must agree
within 1e-5; no device may hold the whole model.

Needs a pytest process started with `KERAS_BACKEND=jax` (conftest.py).
"""

import keras
import numpy as np
import pytest

import multigpu
from multigpu.partition import jax_sharding

TOLERANCE = 1e-5
ROWS, BATCH = 42, 16


def _mlp():
    return keras.Sequential([keras.Input((6,)),
                             keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(10)])


def _cnn():
    return keras.Sequential([keras.Input((6, 6, 3)),
                             keras.layers.Conv2D(8, 3, activation="relu"),
                             keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(4)])


def _embedding():
    return keras.Sequential([keras.Input((5,), dtype="int32"),
                             keras.layers.Embedding(32, 8),
                             keras.layers.GlobalAveragePooling1D(),
                             keras.layers.Dense(4)])


def _batchnorm():
    return keras.Sequential([keras.Input((6,)),
                             keras.layers.Dense(16),
                             keras.layers.BatchNormalization(),
                             keras.layers.Activation("relu"),
                             keras.layers.Dense(4)])


def _two_inputs():
    a, b = keras.Input((4,), name="a"), keras.Input((6,), name="b")
    merged = keras.layers.Concatenate()([keras.layers.Dense(8)(a),
                                         keras.layers.Dense(8)(b)])
    return keras.Model([a, b], keras.layers.Dense(2)(merged))


def _data(model, rng):
    def one(tensor):
        shape = (ROWS, *tensor.shape[1:])
        if "int" in str(tensor.dtype):
            return rng.integers(0, 32, shape).astype("int32")
        return rng.random(shape, dtype="float32")
    x = [one(t) for t in model.inputs]
    x = x[0] if len(x) == 1 else {t.name: v for t, v in zip(model.inputs, x)}
    y = rng.random((ROWS, model.outputs[0].shape[-1]), dtype="float32")
    return x, y


# name: (model, devices, optimizer). Adam would turn the rounding noise of
# the bias BatchNormalization cancels into full steps (a noise of its own
# on any two runs), so the BatchNormalization model trains with SGD.
CASES = {
    "mlp": (_mlp, 4, lambda: keras.optimizers.Adam(0.01)),
    "cnn": (_cnn, 2, lambda: keras.optimizers.Adam(0.01)),
    "embedding": (_embedding, 4, lambda: keras.optimizers.Adam(0.01)),
    "batchnorm": (_batchnorm, 4, lambda: keras.optimizers.SGD(0.1)),
    "two_inputs": (_two_inputs, 2, lambda: keras.optimizers.Adam(0.01)),
}


def _run(model, x, y, optimizer):
    # `fit` takes the uneven batches; `predict` and `evaluate` take all rows
    # at once (one compiled step each: the suite stays fast).
    before = model.predict(x, batch_size=ROWS, verbose=0)
    # An optimizer made before compile, outside model_parallel's scope, as
    # users (and R's optimizer_adam()) make it.
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                        verbose=0).history
    return {"before": before, "history": history,
            "evaluation": model.evaluate(x, y, batch_size=ROWS, verbose=0),
            "after": model.predict(x, batch_size=ROWS, verbose=0),
            "weights": model.get_weights()}


@pytest.fixture(scope="module", params=list(CASES))
def trained(request):
    make, devices, optimizer = CASES[request.param]
    keras.utils.set_random_seed(3)
    model = make()
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    x, y = _data(model, np.random.default_rng(5))
    sharded = multigpu.model_parallel(model, devices=devices)
    return {"name": request.param, "count": devices, "sharded": sharded,
            "model": model, "x": x, "y": y,
            "parallel": _run(sharded, x, y, optimizer()),
            "reference": _run(reference, x, y, optimizer())}


def _largest(a, b):
    a, b = keras.tree.flatten(a), keras.tree.flatten(b)
    assert len(a) == len(b)
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
               for u, v in zip(a, b))


def test_model_parallel_trains_like_one_device(trained):
    parallel, reference = trained["parallel"], trained["reference"]
    assert type(trained["sharded"]).__name__ == "ShardedWeightsModel"
    for part in ("before", "history", "evaluation", "after", "weights"):
        assert _largest(parallel[part], reference[part]) <= TOLERANCE, part
    # Training changed the weights: the comparison is not of two idle models.
    assert _largest(reference["weights"], trained["model"].get_weights()) > 1e-3
    # The distribution was entered for the model's calls only.
    assert keras.distribution.distribution() is None


def _shard_bytes(variables, devices):
    """Bytes of `variables`' shards on each of `devices`, measured."""
    held = {d: 0 for d in devices}
    for variable in {id(v): v for v in variables}.values():
        for shard in variable.value.addressable_shards:
            held[shard.device.id] += shard.data.nbytes
    return held


def test_no_device_holds_the_whole_model(trained):
    sharded, count = trained["sharded"], trained["count"]
    weights = sharded.template.weights
    total = sum(jax_sharding.weight_bytes(v) for v in weights)
    held = _shard_bytes(weights, range(count))
    assert len(held) == count and all(b > 0 for b in held.values())
    assert sum(held.values()) < total * count
    assert max(held.values()) < total
    kernels = [v for v in weights if len(v.shape) >= 2]
    assert kernels
    for kernel in kernels:
        for shard in kernel.value.addressable_shards:
            assert np.prod(shard.data.shape) * count == np.prod(kernel.shape), (
                kernel.path)
    # Trained, the optimizer's slots stay split like their weights.
    slots = [v for v in sharded.optimizer.variables if len(v.shape) >= 2]
    assert all(s.value.sharding.spec != (None,) * len(s.shape) for s in slots)
    assert sharded.weight_table()[0]["variable_bytes"] == held[0]


def test_memory_plan_gives_each_devices_shards(trained):
    sharded, count = trained["sharded"], trained["count"]
    plan = multigpu.memory_plan(sharded, batch_size=BATCH)
    weights = _shard_bytes(sharded.template.weights, range(count))
    gradients = _shard_bytes(sharded.template.trainable_weights, range(count))
    slots = _shard_bytes(sharded.optimizer.variables, range(count))
    assert list(plan.per_device) == sharded.devices
    for index, device in enumerate(sharded.devices):
        entries = plan.per_device[device]
        assert entries["weights"] == weights[index]
        assert entries["gradients"] == gradients[index]
        assert entries["optimizer"] == slots[index]
    assert plan["weights"] == max(weights.values())
    assert plan.as_dict()["per_device"] == plan.per_device


def test_save_writes_a_plain_model_that_predicts_the_same(trained, tmp_path):
    sharded, x = trained["sharded"], trained["x"]
    path = str(tmp_path / "model.keras")
    sharded.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(trained["model"])
    assert _largest(loaded.predict(x, batch_size=ROWS, verbose=0),
                    trained["parallel"]["after"]) <= TOLERANCE


@pytest.mark.parametrize("trained", ["mlp"], indirect=True)
def test_a_plain_model_beside_it_trains_on_one_device(trained):
    assert keras.distribution.distribution() is None
    plain = _mlp()
    plain.compile(optimizer="sgd", loss="mse")
    plain.fit(np.ones((4, 6)), np.ones((4, 10)), verbose=0)
    assert len(plain.layers[0].kernel.value.sharding.device_set) == 1


def test_layouts_split_the_largest_dimension_the_devices_divide():
    assert jax_sharding.weight_axes((784, 256), "float32", 4) == ("model", None)
    assert jax_sharding.weight_axes((8, 16), "float32", 4) == (None, "model")
    assert jax_sharding.weight_axes((8, 8), "float32", 4) == (None, "model")
    assert jax_sharding.weight_axes((3, 3, 3, 8), "float32", 2) == (
        None, None, None, "model")
    assert jax_sharding.weight_axes((10,), "float32", 4) == (None,)
    assert jax_sharding.weight_axes((2,), "uint32", 2) == (None,)  # a seed


def test_a_model_no_weight_of_which_splits_is_refused():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7)])
    with pytest.raises(ValueError) as error:
        multigpu.model_parallel(model, devices=2)
    message = str(error.value)
    assert "Invalid `model` for multigpu.model_parallel() on 2 devices" in message
    assert "every device would hold the whole model" in message
    assert "the `devices` argument" in message and "multiples of 2" in message


def test_a_large_weight_that_cannot_split_is_refused_by_name():
    model = keras.Sequential([keras.Input((3,), dtype="int32"),
                              keras.layers.Embedding(4099, 5, name="words"),
                              keras.layers.Dense(4)])
    with pytest.raises(ValueError) as error:
        multigpu.model_parallel(model, devices=2)
    message = str(error.value)
    assert "'sequential/words/embeddings (4099, 5)'" in message or (
        "words/embeddings (4099, 5)" in message)
    assert "is a multiple of 2" in message and "64 KiB" in message


@pytest.mark.parametrize("argument, value, fix", [
    ("split", ["dense_1"], "Leave split=None"),
    ("microbatches", 2, "Leave microbatches=1"),
])
def test_the_pipelines_arguments_are_refused_on_jax(argument, value, fix):
    with pytest.raises(ValueError) as error:
        multigpu.model_parallel(_mlp(), devices=2, **{argument: value})
    assert f"Invalid `{argument}`: received {value!r}" in str(error.value)
    assert fix in str(error.value)


def test_a_nan_batch_stops_fit_before_it_changes_anything():
    """The NaN guard of the model whose weights are split: `fit` stops at the
    bad batch with the weights one device has after the batches before it."""
    rng = np.random.default_rng(5)
    x, y = _data(_mlp(), rng)
    x[BATCH + 3, 2] = np.nan  # row 4 of the second batch
    keras.utils.set_random_seed(3)
    model = _mlp()
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    sharded = multigpu.model_parallel(model, devices=4)
    sharded.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    with pytest.raises(multigpu.NonFiniteInputError,
                       match="epoch 1, batch 2 .counted from 1.: x has 1 NaN"):
        sharded.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    reference.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    reference.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    for got, want in zip(sharded.get_weights(), reference.get_weights(),
                         strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
