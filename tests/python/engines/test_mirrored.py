"""The mirrored engine: `MirroredModel` keeps the replicate engine's contract.

`multi_gpu_model(model, engine="mirrored")` trains a copy of the template
whose variables are mirrored by a MirroredStrategy. The template holds the
trained weights between calls, predictions equal the template's and a step
on a batch equals the template's step on one device, also when the batch
does not split evenly or leaves a replica without rows.
"""


import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from support.models import (
    copy_of,
    data,
    images,
    max_weight_difference,
    mlp,
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


# The gate: a short final batch (70 rows) and replicas with no rows (3).
@pytest.mark.parametrize("rows, batch_size", [
    pytest.param(10, 10, marks=pytest.mark.full),
    pytest.param(64, 16, marks=pytest.mark.full), (70, 16), (3, 3)])
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


# Full tier: the module zoos predict and evaluate on this engine in the gate.
@pytest.mark.full
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


# Full tier: the zoos check the template's weights after fit in the gate.
@pytest.mark.full
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


# Full tier: test_saving.py's module zoo saves on each engine in turn in the gate.
@pytest.mark.full
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


def test_a_sequential_template_and_cpu_relocation(rng):
    template = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine="mirrored",
                                        cpu_relocation=True)
    assert parallel.template is not template
    x, _ = data(rng, 6)
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=1e-6)


# Full tier: the gate's replicas with zero rows are the 3-row case below and the shape zoo's.
@pytest.mark.full
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


# Full tier: train_on_batch runs in the gate's module zoos (test_replicate.py,
# test_template.py, the step's), each engine in turn.
@pytest.mark.full
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


def test_the_mirrored_engine_refuses_several_steps_per_execution():
    """Keras 3 runs them in a loop whose `merge_call`s fail under
    MirroredStrategy (keras-team/keras#19246): an error naming the fix."""
    parallel = multigpu.multi_gpu_model(mlp(), gpus=4, engine="mirrored")
    with pytest.raises(ValueError, match=(
            r"Invalid `steps_per_execution` for engine='mirrored': received "
            r"3; .*Use steps_per_execution=1 \(the default\) or "
            r"engine='replicate'")):
        parallel.compile(optimizer="sgd", loss="mse", steps_per_execution=3)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_mirrored_engine_model_trains_inside_its_own_strategys_scope(rng):
    template = mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, 2, engine="mirrored")
    x, y = data(rng, 16)
    with parallel.strategy.scope():
        parallel.compile(optimizer="sgd", loss="mse")
        got = parallel.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    reference.compile(optimizer="sgd", loss="mse")
    want = reference.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                               rtol=1e-5)
    assert max_weight_difference(template, reference) < 1e-5
