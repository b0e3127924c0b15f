"""check_equivalence: a correct model agrees on every engine; the two broken
set-ups (BatchNormalization on per-device shares, a loss averaged by the
user under a strategy) are reported with their cause."""

import inspect

import keras
import numpy as np
import pytest

import multigpu
from multigpu import messages
from multigpu.insight.equivalence import EquivalenceReport, check_equivalence
from support.models import model_with_r_layer

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = pytest.mark.zoo(axes=("engine",), scope="module")

ENGINES = ["replicate", "mirrored", "strategy"]


def _data(rng, rows=48, targets="classes"):
    x = rng.normal(size=(rows, 6)).astype("float32")
    if targets == "classes":
        return x, rng.integers(0, 3, rows).astype("int32")
    return x, rng.normal(size=(rows, 1)).astype("float32")


def _classifier(batchnorm=False, synchronized=False):
    layers = [keras.Input((6,)), keras.layers.Dense(8, activation="relu")]
    if batchnorm:
        layers.append(keras.layers.BatchNormalization(
            synchronized=synchronized, name="norm"))
    layers.append(keras.layers.Dense(3, activation="softmax"))
    return keras.Sequential(layers, name="classifier")


def _regressor():
    return keras.Sequential([keras.Input((6,)),
                             keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)], name="regressor")


def _mean_of_squares(y_true, y_pred):
    """A loss that averages the rows itself (returns one number)."""
    return keras.ops.mean(keras.ops.square(y_true - y_pred))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_correct_model_is_equal_on_every_engine(engine, rng):
    x, y = _data(rng)
    model = _classifier()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    before = model.get_weights()
    report = check_equivalence(model, x, y, gpus=4, engine=engine)
    assert isinstance(report, EquivalenceReport)
    assert multigpu.check_equivalence is check_equivalence
    assert report.equal, str(report)
    assert list(report.differences) == ["loss", "accuracy", "weights",
                                        "optimizer_state"]
    assert all(0 <= d <= 1e-5 for d in report.differences.values())
    assert report.first_difference is None and report.cause is None
    assert (report.steps, report.batch_size, len(report.devices)) == (3, 16, 4)
    assert report.engine == report.requested_engine == engine
    assert "equal within tolerance=0.0001" in str(report)
    # The model itself is not trained, nor its optimizer used.
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert not model.optimizer.built


@pytest.mark.parametrize("engine", ENGINES)
def test_batchnorm_is_reported_as_different(engine, rng):
    x, y = _data(rng)
    model = _classifier(batchnorm=True)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    report = check_equivalence(model, x, y, gpus=4, engine=engine)
    assert not report.equal
    assert list(report.differences) == ["loss", "weights",
                                        "batchnorm_statistics",
                                        "optimizer_state"]
    assert report.differences["batchnorm_statistics"] > 1e-3
    assert report.differences["weights"] > 1e-3
    assert report.first_difference == "loss"
    assert "BatchNormalization ('norm')" in report.cause
    assert "about 4 of the 16 rows" in report.cause
    text = str(report)
    assert "loss differs first" in text
    assert "Likely cause: BatchNormalization" in text
    assert ("keras.layers.BatchNormalization(synchronized=True) with "
            "engine='strategy' computes" if engine == "strategy" else
            "sync_batchnorm=True computes the statistics") in text


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_batchnorm_is_equal_with_sync_batchnorm(engine, rng):
    # The fix the report suggests on the engines.
    x, y = _data(rng)
    model = _classifier(batchnorm=True)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    report = check_equivalence(model, x, y, gpus=4, engine=engine,
                               sync_batchnorm=True)
    assert report.equal, str(report)
    assert report.differences["batchnorm_statistics"] < 1e-5


def test_synchronized_batchnorm_is_equal_under_a_strategy(rng):
    # The fix the report suggests for BatchNormalization.
    x, y = _data(rng)
    model = _classifier(batchnorm=True, synchronized=True)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    report = check_equivalence(model, x, y, gpus=4, engine="strategy")
    assert report.equal, str(report)
    assert report.differences["batchnorm_statistics"] < 1e-5


def test_a_loss_averaged_by_the_user_is_reported_under_a_strategy(rng):
    x, y = _data(rng, targets="values")
    model = _regressor()
    model.compile(optimizer="sgd", loss=_mean_of_squares, metrics=["mae"])
    report = check_equivalence(model, x, y, gpus=4, engine="strategy")
    assert not report.equal
    assert report.first_difference == "loss"
    assert report.differences["weights"] > 1e-3
    assert "'_mean_of_squares' returns one number" in report.cause
    assert "about 4 times one device's" in report.cause
    assert "reduction='sum_over_batch_size'" in report.cause
    # On the replicate engine Keras computes that loss on the whole batch.
    assert check_equivalence(model, x, y, gpus=4, engine="replicate").equal


def _squares(y_true, y_pred):
    """The fix the report suggests: one loss value per row, Keras averages."""
    return keras.ops.square(y_true - y_pred)


def test_a_loss_of_one_value_per_row_is_equal_under_a_strategy(rng):
    x, y = _data(rng, targets="values")
    model = _regressor()
    model.compile(optimizer="sgd", loss=_squares)
    report = check_equivalence(model, x, y, gpus=4, engine="strategy")
    assert report.equal, str(report)


def test_a_summed_loss_is_equal_under_a_strategy(rng):
    # Keras 3 leaves a loss with reduction="sum" unscaled under a strategy:
    # the replicas' sums add up to one device's sum. The check says so
    # (this test fails when Keras changes it).
    x, y = _data(rng)
    model = _classifier()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
        reduction="sum"))
    report = check_equivalence(model, x, y, gpus=4, engine="strategy")
    assert report.equal, str(report)


@keras.saving.register_keras_serializable(package="test_equivalence")
def _spread(y_true, y_pred):
    """A metric that is one statistic of the rows it is given (registered:
    check_equivalence makes each copy's metrics anew from the config)."""
    return keras.ops.std(y_pred)


def test_a_metric_of_the_whole_batch_is_reported_alone(rng):
    x, y = _data(rng, targets="values")
    model = _regressor()
    model.compile(optimizer="sgd", loss="mse",
                  metrics=[keras.metrics.MeanMetricWrapper(_spread, name="spread")])
    report = check_equivalence(model, x, y, gpus=4, engine="strategy")
    assert not report.equal
    assert report.first_difference == "spread"
    assert report.differences["loss"] < 1e-5
    assert report.differences["weights"] < 1e-5
    assert report.cause.startswith("only the metrics 'spread' differ")
    # The replicate engine computes metrics on the whole batch.
    assert check_equivalence(model, x, y, gpus=4, engine="replicate").equal


def test_a_metric_object_on_the_mirrored_engine_is_equal(rng):
    # Found by check_equivalence: a metric object made outside the
    # strategy's scope was totalled otherwise within an epoch; the engine
    # now makes it anew in its scope.
    x, y = _data(rng)
    model = _classifier()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                  metrics=[keras.metrics.SparseCategoricalAccuracy()])
    report = check_equivalence(model, x, y, gpus=4, engine="mirrored")
    assert report.equal, str(report)


def test_random_layers_are_named_as_the_cause(rng):
    x, y = _data(rng)
    model = keras.Sequential([keras.Input((6,)),
                              keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.5, name="drop"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    report = check_equivalence(model, x, y, gpus=2, engine="replicate",
                               steps=2)
    assert not report.equal
    assert "random layers ('drop')" in report.cause


def test_batch_size_and_tolerance(rng):
    x, y = _data(rng)
    model = _classifier(batchnorm=True)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    report = check_equivalence(model, x, y, gpus=2, engine="replicate",
                               steps=2, batch_size=10, tolerance=10.0)
    assert (report.steps, report.batch_size) == (2, 10)
    assert report.equal and report.tolerance == 10.0


def test_the_report_speaks_r_in_r(rng):
    x, y = _data(rng)
    model = _classifier(batchnorm=True)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with messages.language("r"):
        report = check_equivalence(model, x, y, gpus=2, engine="mirrored",
                                   steps=1)
        text = str(report)
    assert 'engine = "mirrored"' in text
    assert "sync_batchnorm = TRUE computes the statistics" in report.cause


def test_bad_arguments_are_refused_with_the_fix(rng):
    x, y = _data(rng, rows=12)
    model = _classifier()
    with pytest.raises(ValueError, match="is not compiled"):
        check_equivalence(model, x, y, gpus=2)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="Invalid `engine`: received 'nccl'"):
        check_equivalence(model, x, y, gpus=2, engine="nccl")
    with pytest.raises(ValueError, match="Invalid `steps`"):
        check_equivalence(model, x, y, gpus=2, steps=0)
    with pytest.raises(ValueError, match="rows are too few"):
        check_equivalence(model, x, y, gpus=4, steps=4)
    with pytest.raises(ValueError, match="steps need 18 rows"):
        check_equivalence(model, x, y, gpus=2, batch_size=6)
    with pytest.raises(ValueError, match="a multiple of the 4 devices, e.g. 4"):
        check_equivalence(model, x, y, gpus=4, engine="strategy",
                          batch_size=6, steps=2)
    with pytest.raises(ValueError, match="Invalid `tolerance`"):
        check_equivalence(model, x, y, gpus=2, tolerance=-1)
    with pytest.raises(ValueError, match="Invalid `sync_batchnorm`"):
        check_equivalence(model, x, y, gpus=2, sync_batchnorm="yes")
    with pytest.raises(ValueError, match=(
            "not of engine='strategy'.*synchronized=True")):
        check_equivalence(model, x, y, gpus=2, engine="strategy",
                          sync_batchnorm=True)
    with pytest.raises(ValueError, match="`y`: it has 11 rows"):
        check_equivalence(model, x, y[:11], gpus=2)
    with pytest.raises(TypeError, match="not a dataset"):
        check_equivalence(model, [1, 2], y, gpus=2)
    with pytest.raises(TypeError, match="expected a compiled Keras model"):
        check_equivalence("model", x, y, gpus=2)
    parallel = multigpu.multi_gpu_model(model, gpus=2)
    with pytest.raises(ValueError, match="its `template`"):
        check_equivalence(parallel, x, y, gpus=2)


def test_auto_is_the_default_and_the_report_names_the_engine(rng):
    x, y = _data(rng)
    model = _classifier()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    default = inspect.signature(check_equivalence).parameters["engine"]
    assert default.default == "auto"
    report = check_equivalence(model, x, y, gpus=4)
    assert report.equal, str(report)
    # On logical CPU devices "auto" runs the replicate engine.
    assert (report.requested_engine, report.engine) == ("auto", "replicate")
    assert "logical CPU devices" in report.engine_reason
    text = str(report)
    assert "one device against engine='auto' (the replicate engine) on 4" in text
    assert "Engine: replicate, on logical CPU devices" in text


def test_the_model_is_put_back_as_it_was(rng):
    # A model part-way through training: its optimizer has state, and
    # training goes on after the check as if it had not run.
    x, y = _data(rng)

    def trained_once():
        model = _classifier()
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        model.fit(x[:16], y[:16], batch_size=16, epochs=1, verbose=0)
        return model

    keras.utils.set_random_seed(5)
    model = trained_once()
    keras.utils.set_random_seed(5)
    twin = trained_once()
    optimizer, metrics = model.optimizer, [m.name for m in model.metrics]
    compiled = model.get_compile_config()
    state = [np.array(v) for v in optimizer.variables]
    for engine in ("replicate", "mirrored"):
        check_equivalence(model, x, y, gpus=4, engine=engine)
    assert model.optimizer is optimizer
    assert [m.name for m in model.metrics] == metrics
    assert model.get_compile_config() == compiled
    for before, after in zip(state, optimizer.variables):
        np.testing.assert_array_equal(before, np.array(after))
    for a, b in zip(model.get_weights(), twin.get_weights()):
        np.testing.assert_array_equal(a, b)
    for trained in (model, twin):
        trained.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), twin.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)


# Models whose state a copy could lose: the engines train them as the
# model itself trains on one device, or the report says they differ.

def _normalized_classifier(rng, x):
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(x * 3.0 + 5.0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(norm(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(
        hidden), name="normalized")


def _lookup_classifier(ids):
    lookup = keras.layers.IntegerLookup(name="ids")
    lookup.adapt(ids)
    inputs = keras.Input((3,), dtype="int64")
    embedded = keras.layers.Embedding(24, 4)(lookup(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(
        keras.layers.Flatten()(embedded)), name="looked_up")


@pytest.mark.parametrize("engine", ["auto", *ENGINES])
def test_adapted_preprocessing_trains_alike_on_every_engine(engine, rng):
    x, y = _data(rng)
    x = x * 3.0 + 5.0
    model = _normalized_classifier(rng, x)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    report = check_equivalence(model, x, y, gpus=4, engine=engine)
    assert report.equal, str(report)
    ids = rng.integers(100, 120, (48, 3))
    model = _lookup_classifier(ids)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    report = check_equivalence(model, ids, y, gpus=4, engine=engine)
    assert report.equal, str(report)


class _Scale(keras.layers.Layer):
    """Multiplies by `scale`, an attribute its config does not hold."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scale = 1.0

    def call(self, inputs):
        return inputs * self.scale


def _scaled_classifier():
    inputs = keras.Input((6,))
    scale = _Scale(name="scaled")
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(
        scale(hidden)), name="scaled_model")
    scale.scale = 3.0
    return model


@pytest.mark.parametrize("engine", ["auto", *ENGINES])
def test_state_a_copy_loses_is_reported(engine, rng):
    x, y = _data(rng)
    model = _scaled_classifier()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    before = model.get_weights()
    report = check_equivalence(model, x, y, gpus=4, engine=engine)
    if report.engine == "replicate":
        # The replicate engine trains the model itself: nothing is lost.
        assert report.equal, str(report)
    else:
        assert not report.equal
        assert report.first_difference == "copy"
        assert report.differences["copy"] > 0.1
        assert "layer 'scaled' (_Scale) computes otherwise" in report.cause
        assert "copy differs first" in str(report)
        assert "engine='replicate'" in report.cause
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_the_strategy_engine_refuses_a_layer_written_in_r(rng):
    # Keras's fit under MirroredStrategy traces replicas in threads, where
    # R cannot run.
    model = model_with_r_layer()
    model.compile(optimizer="sgd", loss="mse")
    x = rng.standard_normal((16, 4)).astype("float32")
    y = rng.standard_normal((16, 2)).astype("float32")
    with pytest.raises(ValueError, match=r"'penalty' \(RowPenalty\) runs R "
                       r"code[\s\S]*engine='replicate'"):
        multigpu.check_equivalence(model, x, y, gpus=4, engine="strategy")
