"""multi_gpu_model(..., sync_batchnorm=True): BatchNormalization as one device.

With `sync_batchnorm=True` both engines take BatchNormalization's batch
statistics over the whole batch, so a training step equals the template's
on that batch: trainable weights and moving statistics. Each model trains
over 13 rows in batches of 10, so one fit has a batch that splits unevenly
(replicate: 2/3/2/3 rows, walked across the replicas; mirrored: 3/3/3/1)
and a last batch of 3 rows on 4 devices (mirrored: a replica with no rows;
replicate: one device, as planned for any batch smaller than the devices).
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from multigpu.engines.tensorflow import sync_batchnorm
from multigpu.placement import ops_by_device
from support.models import max_weight_difference

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]

TOL = 1e-5
ENGINES = ("replicate", "mirrored")


def _sequential():
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8),
        keras.layers.BatchNormalization(momentum=0.5),
        keras.layers.Dense(1),
    ], name="sequential_bn")


def _branches():
    """Convolutions with BN on both axes, two branches, BN on a dense layer.

    With a squeeze-and-excitation block as MobileNetV3 has: an `Add` of
    two (rows, 1, 1, channels) tensors, which Keras cannot trace on a
    static batch of zero rows.
    """
    inputs = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3, padding="same")(inputs)
    x = keras.layers.BatchNormalization(momentum=0.5)(x)
    x = keras.layers.MaxPooling2D()(x)
    squeezed = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    excited = keras.layers.Add()(
        [squeezed, keras.layers.Conv2D(3, 1)(squeezed)])
    x = keras.layers.Multiply()([x, excited])
    y = keras.layers.Conv2D(3, 3, padding="same")(x)
    y = keras.layers.BatchNormalization(axis=1, momentum=0.5)(y)
    x = keras.layers.Add()([x, keras.layers.Activation("relu")(y)])
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(5)(x)
    x = keras.layers.BatchNormalization(momentum=0.5)(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="branches_bn")


def _nested():
    """BN inside a Sequential inside a functional model (as an application
    with a new head, or a KerasHub task around its backbone)."""
    inputs = keras.Input((4,))
    body = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(6),
        keras.layers.BatchNormalization(momentum=0.5)], name="body")
    x = keras.layers.BatchNormalization(axis=-1, momentum=0.5)(body(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(x), name="nested_bn")


@keras.saving.register_keras_serializable(package="multigpu_tests")
class _SubclassedBN(keras.Model):
    """BatchNormalization inside code: the replicate engine cannot walk it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(6)
        self.norm = keras.layers.BatchNormalization(momentum=0.5)
        self.out = keras.layers.Dense(1)

    def call(self, x, training=None):
        return self.out(self.norm(self.hidden(x), training=training))


class _SubclassedPlain(keras.Model):
    """A subclassed model without BatchNormalization."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(x)


def _subclassed():
    model = _SubclassedBN(name="subclassed_bn")
    model(np.zeros((1, 4), "float32"))
    return model


def _dense_data(rng, rows):
    x = rng.standard_normal((rows, 4)).astype("float32")
    return x, (x @ np.arange(1, 5, dtype="float32"))[:, None]


def _image_data(rng, rows):
    x = rng.standard_normal((rows, 6, 6, 2)).astype("float32")
    return x, rng.integers(0, 3, rows).astype("int32")


# name: (factory, data, loss)
MODELS = {
    "sequential": (_sequential, _dense_data, "mse"),
    "branches": (_branches, _image_data, "sparse_categorical_crossentropy"),
    "nested": (_nested, _dense_data, "mse"),
}


def _pair(factory, seed=3):
    """The template and an independent copy with the same initial weights."""
    keras.utils.set_random_seed(seed)
    template = factory()
    keras.utils.set_random_seed(seed)
    reference = factory()
    assert max_weight_difference(template, reference) == 0
    return template, reference


def _train(models, x, y, loss, batch_size=10):
    for model in models:
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
                      loss=loss)
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False,
                  verbose=0)


def _moving_statistics(model):
    return [keras.ops.convert_to_numpy(w)
            for layer in sync_batchnorm.batch_norm_layers(model)
            for w in (layer.moving_mean, layer.moving_variance)]


def _assert_trained_alike(template, reference, tol=TOL):
    assert max_weight_difference(template, reference) < tol
    for ours, theirs in zip(_moving_statistics(template),
                            _moving_statistics(reference)):
        np.testing.assert_allclose(ours, theirs, atol=tol, rtol=tol)
    # The statistics did move: the comparison is not of initial values.
    assert not np.allclose(_moving_statistics(template)[0], 0.0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_step_equals_the_templates_moving_statistics_included(
        name, engine, rng):
    factory, make_data, loss = MODELS[name]
    template, reference = _pair(factory)
    x, y = make_data(rng, 13)
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine=engine,
                                        sync_batchnorm=True)
    assert parallel.engine == engine and parallel.sync_batchnorm is True
    _train([parallel, reference], x, y, loss)
    _assert_trained_alike(template, reference)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["sequential", "branches"])
def test_a_batch_smaller_than_the_devices(name, engine, rng):
    # 3 rows on 4 devices, a batch of known size: the mirrored engine's
    # last replica has none; the replicate engine runs it on one device.
    factory, make_data, loss = MODELS[name]
    template, reference = _pair(factory)
    x, y = make_data(rng, 3)
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine=engine,
                                        sync_batchnorm=True)
    _train([parallel, reference], x, y, loss, batch_size=3)
    _assert_trained_alike(template, reference)


def test_each_replica_differentiates_on_its_device(rng):
    template = keras.Sequential([
        keras.Input((8,)), keras.layers.Dense(16),
        keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    parallel = multigpu.multi_gpu_model(template, gpus=["/cpu:2", "/cpu:3"],
                                        engine="replicate",
                                        sync_batchnorm=True)
    parallel.compile(optimizer="sgd", loss="mse")
    x = rng.standard_normal((16, 8)).astype("float32")
    y = rng.standard_normal((16, 3)).astype("float32")
    _, ops = multigpu.executed_ops(
        parallel.fit, x, y, batch_size=16, epochs=1, verbose=0)
    matmuls = ops_by_device(ops, lambda op: "MatMul" in op)
    # As without sync_batchnorm (test_replica_placement.py): 2 forward and
    # 3 backward matmuls per replica (every batch has 16 rows, a size known
    # when the step is traced: the path for batches smaller than the
    # devices is not traced). None on the merge device.
    assert matmuls == {"/device:CPU:2": 5, "/device:CPU:3": 5}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_default_keeps_statistics_per_replica(engine, rng):
    template, reference = _pair(_sequential)
    x, y = _dense_data(rng, 8)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    assert parallel.sync_batchnorm is False
    _train([parallel, reference], x, y, "mse", batch_size=8)
    # Four rows per replica normalise differently from eight: the
    # difference sync_batchnorm removes.
    assert max_weight_difference(template, reference) > 1e-3


def test_predictions_are_the_templates(rng):
    template, _ = _pair(_branches)
    x, _ = _image_data(rng, 10)
    for engine in ENGINES:
        parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine,
                                            sync_batchnorm=True)
        np.testing.assert_allclose(
            parallel.predict(x, batch_size=10, verbose=0),
            template.predict(x, batch_size=10, verbose=0),
            atol=TOL, rtol=TOL)


@pytest.mark.parametrize("value", ["yes", 1, 0.5, [True], np.array([True])])
def test_invalid_values_are_named_with_the_fix(value):
    with pytest.raises(ValueError) as caught:
        multigpu.multi_gpu_model(_sequential(), gpus=2, sync_batchnorm=value)
    message = str(caught.value)
    assert "`sync_batchnorm`" in message
    assert "received" in message and "sync_batchnorm=True" in message


def test_none_is_the_backends_default_per_replica_statistics_on_tensorflow():
    parallel = multigpu.multi_gpu_model(_sequential(), gpus=2, sync_batchnorm=None)
    assert parallel.sync_batchnorm is False


def test_numpy_bools_are_accepted():
    parallel = multigpu.multi_gpu_model(_sequential(), gpus=2,
                                        sync_batchnorm=np.bool_(True))
    assert parallel.sync_batchnorm is True


def test_replicate_engine_refuses_batch_norm_inside_code():
    with pytest.raises(ValueError, match="engine='mirrored'") as caught:
        multigpu.multi_gpu_model(_subclassed(), gpus=2, engine="replicate",
                                 sync_batchnorm=True)
    assert "sync_batchnorm=True" in str(caught.value)
    # Without sync_batchnorm the replicate engine takes it, as always.
    multigpu.multi_gpu_model(_subclassed(), gpus=2, engine="replicate")


def test_batch_norm_inside_code_is_found_at_any_depth():
    # A subclassed model holding BatchNormalization, inside a Sequential,
    # inside a functional model: the walk could not pool it.
    inner = keras.Sequential([keras.Input((4,)), _subclassed()], name="inner")
    inputs = keras.Input((4,))
    outer = keras.Model(inputs, keras.layers.Dense(1)(inner(inputs)))
    problem = sync_batchnorm.walk_problem(outer)
    assert problem and "'subclassed_bn'" in problem
    with pytest.raises(ValueError, match="engine='mirrored'"):
        multigpu.multi_gpu_model(outer, gpus=2, engine="replicate",
                                 sync_batchnorm=True)
    assert sync_batchnorm.walk_problem(_nested()) is None


def test_auto_runs_the_mirrored_engine_for_batch_norm_inside_code(rng):
    template, reference = _pair(_subclassed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel = multigpu.multi_gpu_model(template, gpus=2,
                                            sync_batchnorm=True)
    assert parallel.engine == "mirrored"
    assert "sync_batchnorm=True" in parallel.engine_reason
    assert any("runs the mirrored engine" in str(w.message) for w in caught)
    x, y = _dense_data(rng, 13)
    _train([parallel, reference], x, y, "mse")
    _assert_trained_alike(template, reference)


def test_models_without_batch_norm_take_it_on_either_engine(rng):
    # Nothing to pool: a subclassed model without BatchNormalization stays
    # on the replicate engine, and trains as its template.
    template = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    parallel = multigpu.multi_gpu_model(template, gpus=2,
                                        engine="replicate",
                                        sync_batchnorm=True)
    assert parallel.engine == "replicate"
    model = _SubclassedPlain(name="no_bn")
    model(np.zeros((1, 4), "float32"))
    parallel = multigpu.multi_gpu_model(model, gpus=2, sync_batchnorm=True)
    assert parallel.engine == "replicate"


def test_renorm_is_refused_by_name():
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(3),
        keras.layers.BatchNormalization(renorm=True, name="renormed")])
    for engine in ENGINES:
        with pytest.raises(ValueError, match="renormed"):
            multigpu.multi_gpu_model(model, gpus=2, engine=engine,
                                     sync_batchnorm=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_setting_is_in_the_config(engine):
    parallel = multigpu.multi_gpu_model(_sequential(), gpus=2,
                                        engine=engine, sync_batchnorm=True)
    config = parallel.get_config()
    assert config["sync_batchnorm"] is True
    again = type(parallel).from_config(config)
    assert again.sync_batchnorm is True


def test_pooled_moments_weigh_shares_by_rows(rng):
    x = tf.constant(rng.standard_normal((10, 3, 2)).astype("float32"))
    shares = [(None, x[:0]), (None, x[:1]), (None, x[1:7]), (None, x[7:])]
    mean, variance = sync_batchnorm.pooled_moments(shares, [0, 1], tf.add_n)
    expected_mean, expected_variance = tf.nn.moments(x, [0, 1])
    np.testing.assert_allclose(mean, expected_mean, atol=1e-6)
    np.testing.assert_allclose(variance, expected_variance, atol=1e-6)
