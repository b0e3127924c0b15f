"""multi_gpu_model(engine=...): the mirrored engine keeps the replicate contract."""

import inspect
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from multigpu.engines import choice as choice_lib
from multigpu.engines import front as engines
from multigpu.engines.tensorflow import mirrored
from support.models import (
    copy_of,
    data,
    images,
    max_weight_difference,
    mlp,
    model_with_r_layer,
    pooled_cnn,
)


def _pair(gpus=4, optimizer=lambda: keras.optimizers.SGD(0.1, momentum=0.5)):
    """A mirrored parallel model and an independent reference copy."""
    template = mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=gpus, engine="mirrored")
    parallel.compile(optimizer=optimizer(), loss="mse", metrics=["mae"])
    reference.compile(optimizer=optimizer(), loss="mse", metrics=["mae"])
    return template, parallel, reference


def test_default_engine_is_auto():
    default = inspect.signature(multigpu.multi_gpu_model).parameters["engine"]
    assert default.default == engines.DEFAULT_ENGINE == "auto"


def _built_with_engine_warnings(**kwargs):
    """`multi_gpu_model(mlp(), **kwargs)` and its warnings about the engine."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel = multigpu.multi_gpu_model(mlp(), **kwargs)
    return parallel, [str(w.message) for w in caught
                      if "engine=" in str(w.message)]


def test_auto_runs_the_replicate_engine_on_logical_cpu_devices():
    parallel, engine_warnings = _built_with_engine_warnings(gpus=2)
    assert not engine_warnings
    assert isinstance(parallel, multigpu.ParallelModel)
    assert parallel.engine == "replicate"
    assert "logical CPU devices" in parallel.engine_reason


def test_explicit_engines_run_as_requested():
    for engine, kind in (("replicate", multigpu.ParallelModel),
                         ("mirrored", mirrored.MirroredModel)):
        parallel = multigpu.multi_gpu_model(mlp(), gpus=2, engine=engine)
        assert isinstance(parallel, kind) and parallel.engine == engine
        assert parallel.engine_reason == f"requested with engine='{engine}'"


@pytest.fixture
def devices_read_as_gpus(monkeypatch):
    """`choose_engine` judging the logical devices as if they were GPUs."""
    choose = choice_lib.choose_engine
    monkeypatch.setattr(choice_lib, "choose_engine", lambda devices: choose(
        [f"/device:GPU:{i}" for i in range(len(devices))]))


@pytest.mark.usefixtures("devices_read_as_gpus")
def test_auto_runs_the_predicted_winner():
    parallel, engine_warnings = _built_with_engine_warnings(gpus=4)
    assert not engine_warnings
    assert isinstance(parallel, mirrored.MirroredModel)
    assert "on 4 GPUs" in parallel.engine_reason


@pytest.mark.usefixtures("devices_read_as_gpus")
def test_auto_falls_back_once_naming_cpu_merge():
    parallel, messages = _built_with_engine_warnings(gpus=4, cpu_merge=False)
    assert len(messages) == 1
    assert "would pick the mirrored engine" in messages[0]
    assert "but cpu_merge=False places the merge" in messages[0]
    assert isinstance(parallel, multigpu.ParallelModel)
    assert parallel.merge_device == parallel.devices[0]
    assert "fell back: cpu_merge=False" in parallel.engine_reason


class Scaled(keras.Model):
    """A subclassed model without `get_config`: it cannot be cloned."""

    def __init__(self, units):
        super().__init__()
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return self.dense(x) * 2.0


@pytest.mark.usefixtures("devices_read_as_gpus")
def test_auto_falls_back_on_a_model_the_mirrored_engine_cannot_copy(rng):
    template = Scaled(3)
    x, _ = data(rng, 8)
    template(x[:1])
    with pytest.warns(UserWarning, match=r"cannot take the model \(Invalid "
                                         r"`model` for engine='mirrored'"):
        parallel = multigpu.multi_gpu_model(template, gpus=4)
    assert parallel.engine == "replicate"
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), rtol=1e-6)
    with pytest.raises(ValueError, match=r"cannot be cloned"):
        multigpu.multi_gpu_model(template, gpus=4, engine="mirrored")


def test_invalid_engine_and_flags_are_named():
    with pytest.raises(ValueError, match=r"`engine`: received 'nccl'"):
        multigpu.multi_gpu_model(mlp(), gpus=2, engine="nccl")
    with pytest.raises(ValueError, match=r"`cpu_merge`: received False"):
        multigpu.multi_gpu_model(mlp(), gpus=2, engine="mirrored",
                                 cpu_merge=False)


def test_mirrored_engine_mirrors_variables_over_the_resolved_devices():
    template = mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine="mirrored")
    assert isinstance(parallel, multigpu.MirroredModel)
    assert parallel.devices == multigpu.resolve_devices(4)
    assert parallel.template is template
    assert parallel.strategy.num_replicas_in_sync == 4
    assert parallel.strategy is multigpu.mirrored_strategy(4)
    for variable in parallel.trainable_variables:
        assert isinstance(variable.value, tf.distribute.DistributedValues)
    assert not any(isinstance(v.value, tf.distribute.DistributedValues)
                   for v in template.weights)


@pytest.mark.parametrize("rows, batch_size", [(10, 10), (64, 16), (70, 16),
                                              (3, 3)])
def test_training_equals_the_template_on_one_device(rng, rows, batch_size):
    # 10 rows split 3/3/2/2 over 4 replicas, 70 rows end with a batch of 6,
    # 3 rows leave one replica empty: still the single-device mathematics.
    template, parallel, reference = _pair()
    x, y = data(rng, rows)
    got = parallel.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False,
                       verbose=0)
    want = reference.fit(x, y, batch_size=batch_size, epochs=1,
                         shuffle=False, verbose=0)
    assert max_weight_difference(template, reference) < 1e-5
    np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                               rtol=1e-5)
    np.testing.assert_allclose(got.history["mae"], want.history["mae"],
                               rtol=1e-5)


def test_predictions_and_evaluation_match_the_template(rng):
    template, parallel, reference = _pair()
    x, y = data(rng, 45)
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)
    np.testing.assert_allclose(parallel.predict(x, batch_size=10, verbose=0),
                               template.predict(x, verbose=0), atol=1e-6)
    template.compile(loss="mse", metrics=["mae"])
    np.testing.assert_allclose(
        parallel.evaluate(x, y, batch_size=10, verbose=0),
        template.evaluate(x, y, batch_size=10, verbose=0), rtol=1e-5)


def test_the_template_holds_the_weights_of_every_epoch(rng):
    template, parallel, reference = _pair()
    at_epoch_start = []
    watcher = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: at_epoch_start.append(
            [w.copy() for w in template.get_weights()]))
    x, y = data(rng, 32)
    parallel.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                 callbacks=[watcher])
    reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    # During fit, the template already holds what epoch 0 trained.
    assert max(np.max(np.abs(a - b)) for a, b in
               zip(at_epoch_start[1], reference.get_weights())) < 1e-5
    reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert max_weight_difference(template, reference) < 1e-5


def test_changes_to_the_template_reach_the_replicas(rng):
    template, parallel, _ = _pair()
    x, _ = data(rng, 8)
    template.set_weights([np.zeros_like(w) for w in template.get_weights()])
    np.testing.assert_array_equal(parallel.predict(x, verbose=0), 0)
    parallel.set_weights([np.ones_like(w) for w in template.get_weights()])
    np.testing.assert_array_equal(template.get_weights()[0], 1)
    # Sub-batches and the whole batch round differently in float32 (the
    # matrix products block by rows), hence a tolerance, not equality.
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), rtol=1e-5)


def test_saving_writes_the_trained_template(rng, tmp_path):
    template, parallel, _ = _pair()
    x, y = data(rng, 32)
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)
    parallel.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert loaded.name == template.name
    np.testing.assert_allclose(loaded.predict(x, verbose=0),
                               parallel.predict(x, verbose=0), atol=1e-6)
    parallel.save_weights(tmp_path / "w.weights.h5")
    parallel.train_on_batch(x, y)
    assert max_weight_difference(template, loaded) > 0  # train_on_batch
    parallel.load_weights(tmp_path / "w.weights.h5")
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               loaded.predict(x, verbose=0), atol=1e-6)


def test_checkpoint_callbacks_work_with_the_mirrored_engine(rng, tmp_path):
    template, parallel, _ = _pair()
    x, y = data(rng, 32)
    parallel.fit(x, y, batch_size=8, epochs=2, verbose=0,
                 callbacks=multigpu.checkpoint_callbacks(tmp_path))
    restored = keras.models.load_model(tmp_path / "ckpt-2.keras")
    assert max_weight_difference(template, restored) == 0


def test_both_engines_and_two_device_sets_train_in_one_process(rng):
    x, y = data(rng, 40)
    losses = []
    for gpus, engine in ((2, "mirrored"), (4, "replicate"), (3, "mirrored")):
        parallel = multigpu.multi_gpu_model(mlp(), gpus=gpus, engine=engine)
        parallel.compile(optimizer="sgd", loss="mse")
        losses.append(parallel.fit(x, y, batch_size=10, verbose=0)
                      .history["loss"][0])
    assert all(np.isfinite(losses))


def test_a_sequential_template_and_cpu_relocation(rng):
    template = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine="mirrored",
                                        cpu_relocation=True)
    assert parallel.template is not template
    x, _ = data(rng, 6)
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=1e-6)


def test_replicas_left_with_zero_rows_of_a_pooled_cnn(rng):
    # A last batch of 1 row on 4 replicas: three get zero rows, on which
    # oneDNN's convolution after MaxPooling fails ("input depth must be
    # evenly divisible by filter depth").
    template = pooled_cnn()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine="mirrored")
    x, y = images(rng, 9)
    histories = []
    for model in (reference, parallel):
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss="sparse_categorical_crossentropy")
        histories.append(model.fit(x, y, batch_size=8, epochs=2,
                                   shuffle=False, verbose=0))
    assert max_weight_difference(template, reference) < 1e-5
    np.testing.assert_allclose(histories[1].history["loss"],
                               histories[0].history["loss"], rtol=1e-5)
    np.testing.assert_allclose(parallel.predict(x, batch_size=8, verbose=0),
                               reference.predict(x, batch_size=8, verbose=0),
                               atol=1e-5)


@pytest.mark.parametrize("rows", [0, 2, 7])
def test_predict_on_batch_splits_the_batch_once(rng, rows):
    # Keras's predict_on_batch under a strategy runs the whole batch on
    # every replica and concatenates: 3 replicas gave 21 rows for 7.
    template, parallel, _ = _pair(gpus=3)
    x, _ = data(rng, rows)
    got = parallel.predict_on_batch(x)
    assert got.shape == (rows, 3)
    if rows:
        np.testing.assert_allclose(got, template.predict_on_batch(x),
                                   atol=1e-6)


def test_train_on_batch_with_adam_and_an_embedding_equals_the_template(rng):
    # Keras's train_on_batch gave every replica the whole batch; Adam then
    # saw the Embedding's sparse gradient several times (1.3e-2 off).
    from support.models import zoo_batch, zoo_embedding_lstm

    template = zoo_embedding_lstm()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=3, engine="mirrored")
    parallel.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse",
                     metrics=["mae"])
    reference.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse",
                      metrics=["mae"])
    x, y = zoo_batch(template, rng, 7)
    got = parallel.train_on_batch(x, y)
    want = reference.train_on_batch(x, y)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert max_weight_difference(template, reference) < 1e-5
    assert parallel.train_on_batch(x, y, return_dict=True).keys() == {
        "loss", "mae"}


def test_a_replica_with_a_static_share_of_zero_rows_adds_tensors(rng):
    # 9 rows on 4 replicas: tf.distribute gives 3/3/3/0, and the last
    # replica's static (0, n) shapes made Keras's Add emit an invalid BiasAdd.
    from support.models import zoo_batch, zoo_residual

    template = zoo_residual()
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine="mirrored")
    x, y = zoo_batch(template, rng, 9)
    np.testing.assert_allclose(parallel.predict_on_batch(x),
                               template.predict_on_batch(x), atol=1e-6)


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_training_with_validation_data_equals_the_template(rng, engine):
    # fit validates through evaluate(): the replicas' weights of the epoch
    # being trained must be the ones evaluated and trained on afterwards.
    template = mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    for model in (parallel, reference):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = data(rng, 32)
    x_val, y_val = data(rng, 12)
    arguments = dict(batch_size=8, epochs=3, shuffle=False, verbose=0,
                     validation_data=(x_val, y_val))
    got = parallel.fit(x, y, **arguments).history
    want = reference.fit(x, y, **arguments).history
    assert max_weight_difference(template, reference) < 1e-5
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["val_loss"], want["val_loss"], rtol=1e-5)


def test_the_mirrored_engine_refuses_several_steps_per_execution():
    """Keras 3 runs them in a loop whose `merge_call`s fail under
    MirroredStrategy (keras-team/keras#19246): an error naming the fix."""
    parallel = multigpu.multi_gpu_model(mlp(), gpus=4, engine="mirrored")
    with pytest.raises(ValueError, match=(
            r"Invalid `steps_per_execution` for engine='mirrored': received "
            r"3; .*Use steps_per_execution=1 \(the default\) or "
            r"engine='replicate'")):
        parallel.compile(optimizer="sgd", loss="mse", steps_per_execution=3)


def test_a_layer_written_in_r_keeps_the_replicate_engine():
    # The mirrored engine traces replicas in threads, where R cannot run.
    model = model_with_r_layer()
    with pytest.raises(ValueError, match=r"'penalty' \(RowPenalty\) runs R "
                       r"code[\s\S]*engine='replicate'"):
        multigpu.multi_gpu_model(model, gpus=4, engine="mirrored")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert multigpu.multi_gpu_model(model, gpus=4).engine == "replicate"
