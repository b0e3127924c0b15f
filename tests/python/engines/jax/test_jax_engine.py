"""multi_gpu_model on the JAX backend: the template's numbers, split by XLA.

Keras chooses its backend once, at import, and JAX fixes its number of CPU
devices when it starts: these tests need a pytest process started with
`KERAS_BACKEND=jax` (`make test-python-jax`), where the root conftest gives
JAX 4 CPU devices. In any other process they are skipped, saying so. (A
conftest.py of this folder's own would replace the root one as the module
`conftest`, which other tests import from.)
"""

import jax
import keras
import numpy as np
import pytest

import multigpu
from multigpu.engines.jax import mesh as mesh_lib
from multigpu.engines.jax.sharded import ShardedModel
from support.models import copy_of, normalized_mlp

# Weights and predictions: absolute; losses and metrics, sums over rows
# whose order differs across devices: relative (as the TensorFlow engines'
# tests).
TOLERANCE = 1e-5




def rows_of(rows, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 6)).astype("float32")
    y = rng.standard_normal((rows, 3)).astype("float32")
    return x, y


def compiled(model, optimizer):
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    return model


def largest_difference(a, b):
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
               for u, v in zip(a, b))


def test_the_backend_is_jax_with_four_devices():
    assert keras.backend.backend() == "jax"
    assert multigpu.available_devices() == {
        "GPU": [], "CPU": [f"/device:CPU:{i}" for i in range(4)]}
    assert len(jax.devices("cpu")) == 4


def test_devices_resolve_in_the_same_forms():
    multigpu.devices.STATE.reset()  # the warning is given once per process
    with pytest.warns(UserWarning, match="No GPU found"):
        assert multigpu.resolve_devices(2) == ["/device:CPU:0", "/device:CPU:1"]
    assert multigpu.resolve_devices(["/cpu:1", "cpu:3"]) == [
        "/device:CPU:1", "/device:CPU:3"]
    with pytest.raises(ValueError, match="only 4 logical CPU"):
        multigpu.resolve_devices(5)
    with pytest.raises(ValueError, match="this machine has no GPU"):
        multigpu.resolve_devices([0, 1])
    with pytest.raises(ValueError, match="Unknown device"):
        multigpu.resolve_devices(["/gpu:0", "/gpu:1"])


def test_virtual_devices_again_is_harmless_and_another_count_too_late():
    assert multigpu.virtual_devices(4) == [f"/device:CPU:{i}" for i in range(4)]
    with pytest.raises(RuntimeError, match=r"virtual_devices\(2\) came too late: "
                       "JAX already started, with 4 CPU device"):
        multigpu.virtual_devices(2)


@pytest.mark.parametrize("argument, value", [("device_type", "GPU"), ("threads", 2)])
def test_virtual_devices_refuses_what_jax_cannot_do(argument, value):
    kwargs = {argument: value}
    if argument == "device_type":
        kwargs["memory_limit"] = 1024
    with pytest.raises(ValueError, match=f"Invalid `{argument}`.*JAX backend"):
        multigpu.virtual_devices(4, **kwargs)


# Each batch shape once in the gate, with the optimizers taken in turn.
@pytest.mark.zoo(axes=("optimizer",))
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("rows, batch_size, devices", [
    (48, 16, 4),  # even: 4 rows per device
    (42, 16, 4),  # uneven: the last batch of 10 splits 3, 3, 3, 1
    (3, 3, 4),    # fewer rows than devices
    (10, 10, 4),
    (10, 5, 2),   # a subset of the devices
])
def test_training_equals_the_template_on_one_device(optimizer, rows, batch_size,
                                                    devices):
    template = normalized_mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=devices)
    assert isinstance(parallel, ShardedModel) and parallel.engine == "jax"
    compiled(parallel, keras.optimizers.get(optimizer))
    compiled(reference, keras.optimizers.get(optimizer))
    x, y = rows_of(rows)
    fitted = parallel.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False,
                          verbose=0).history
    expected = reference.fit(x, y, batch_size=batch_size, epochs=2,
                             shuffle=False, verbose=0).history
    for key in ("loss", "mae"):
        np.testing.assert_allclose(fitted[key], expected[key], rtol=TOLERANCE)
    # The template holds the trained weights, moving statistics included.
    assert largest_difference(template.get_weights(),
                              reference.get_weights()) < TOLERANCE
    x_test, y_test = rows_of(rows, seed=1)
    np.testing.assert_allclose(
        parallel.evaluate(x_test, y_test, batch_size=batch_size, verbose=0),
        reference.evaluate(x_test, y_test, batch_size=batch_size, verbose=0),
        rtol=TOLERANCE)
    np.testing.assert_allclose(
        parallel.predict(x_test, batch_size=batch_size, verbose=0),
        reference.predict(x_test, batch_size=batch_size, verbose=0),
        atol=TOLERANCE)


def test_sample_weights_validation_and_a_multi_input_model_match():
    first = keras.Input((6,), name="first")
    second = keras.Input((2,), name="second")
    joined = keras.layers.Concatenate()([first, second])
    # (A ReLU before BatchNormalization: a bias right before it has a zero
    # gradient, whose rounding noise Adam would scale up to a step.)
    hidden = keras.layers.Dense(5, activation="relu")(joined)
    hidden = keras.layers.BatchNormalization()(hidden)
    template = keras.Model([first, second], keras.layers.Dense(3)(hidden))
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    x, y = rows_of(42)
    inputs = [x, x[:, :2] * 2.0]
    weights = np.linspace(0.1, 2.0, 42).astype("float32")
    histories = []
    for model in (parallel, reference):
        model.compile(optimizer="adam", loss="mse", weighted_metrics=["mae"])
        histories.append(model.fit(inputs, y, sample_weight=weights,
                                   batch_size=16, epochs=2, shuffle=False,
                                   validation_split=0.25, verbose=0).history)
    for key in ("loss", "mae", "val_loss", "val_mae"):
        np.testing.assert_allclose(histories[0][key], histories[1][key],
                                   rtol=TOLERANCE)
    assert largest_difference(template.get_weights(),
                              reference.get_weights()) < TOLERANCE


def _compiled_train_step(parallel, x, y):
    """The text of the train step XLA compiled for `parallel` on `(x, y)`."""
    parallel.train_on_batch(x, y)  # builds the optimizer's variables
    state = (
        [v.value for v in parallel.trainable_variables],
        [v.value for v in parallel.non_trainable_variables],
        [v.value for v in parallel.optimizer.variables],
        [v.value for v in parallel.metrics_variables],
    )
    data = mesh_lib.put_replicated((x, y), parallel.mesh)
    return jax.jit(parallel.train_step).lower(state, data).compile().as_text()


@pytest.mark.parametrize("rows, per_device", [(48, 12), (10, 3)])
def test_the_compiled_step_splits_the_batch_over_the_devices(rows, per_device):
    parallel = compiled(multigpu.multi_gpu_model(normalized_mlp(), gpus=4), "sgd")
    text = _compiled_train_step(parallel, *rows_of(rows))
    # Each device's program holds its share of the rows (the hidden layer's
    # activations), never the whole batch, and the gradients are summed
    # across the devices.
    assert f"f32[{per_device},8]" in text
    assert f"f32[{rows},8]" not in text
    assert "all-reduce" in text


def test_the_saved_file_is_the_template_and_loads_with_keras(tmp_path):
    template = normalized_mlp()
    parallel = compiled(multigpu.multi_gpu_model(template, gpus=4), "adam")
    x, y = rows_of(42)
    parallel.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    parallel.save(path)
    loaded = keras.models.load_model(path)
    assert not isinstance(loaded, ShardedModel) and loaded.name == template.name
    np.testing.assert_allclose(loaded.predict(x, verbose=0),
                               parallel.predict(x, verbose=0), atol=TOLERANCE)
    weights = tmp_path / "model.weights.h5"
    parallel.save_weights(weights)
    fresh = multigpu.multi_gpu_model(normalized_mlp(), gpus=4)
    fresh.load_weights(weights)
    assert fresh.template.trainable_variables[0].value.sharding.is_fully_replicated
    np.testing.assert_allclose(fresh.predict(x, verbose=0),
                               parallel.predict(x, verbose=0), atol=TOLERANCE)


def test_the_template_compiles_alike_and_evaluates_alone():
    template = normalized_mlp()
    parallel = compiled(multigpu.multi_gpu_model(template, gpus=4), "sgd")
    assert template.optimizer is parallel.optimizer
    x, y = rows_of(10)
    np.testing.assert_allclose(template.evaluate(x, y, verbose=0),
                               parallel.evaluate(x, y, verbose=0), rtol=TOLERANCE)


@pytest.mark.parametrize("argument, value, why", [
    ("cpu_merge", False, "a step XLA's split does not have"),
    ("cpu_relocation", True, "replicated on every device"),
    ("sync_batchnorm", False, "that is sync_batchnorm=True"),
    ("engine", "replicate", "tf.device"),
    ("engine", "mirrored", "MirroredStrategy"),
    ("engine", "fastest", "expected 'auto' or 'jax'"),
])
def test_arguments_that_mean_nothing_on_jax_are_refused(argument, value, why):
    with pytest.raises(ValueError, match=f"Invalid `{argument}`.*{why}"):
        multigpu.multi_gpu_model(normalized_mlp(), gpus=2, **{argument: value})


def test_the_jax_engine_by_name_and_sync_batchnorm_true_are_accepted():
    parallel = multigpu.multi_gpu_model(normalized_mlp(), gpus=2, engine="jax",
                                        sync_batchnorm=True)
    assert parallel.engine == "jax" and parallel.sync_batchnorm is True
    assert "requested" in parallel.engine_reason


@pytest.mark.parametrize("argument, value", [("jit_compile", False),
                                             ("run_eagerly", True)])
def test_a_step_xla_does_not_compile_is_refused(argument, value):
    parallel = multigpu.multi_gpu_model(normalized_mlp(), gpus=2)
    with pytest.raises(ValueError, match=f"Invalid `{argument}`.*one device"):
        parallel.compile(optimizer="sgd", loss="mse", **{argument: value})


def test_the_step_is_compiled_as_one_xla_program():
    # Keras's JAX trainer jits the step only when the model's `jit_compile`
    # reads True; otherwise it runs op by op (110 ms a step where one
    # device takes 3 ms).
    parallel = multigpu.multi_gpu_model(normalized_mlp(), gpus=2)
    parallel.compile(optimizer="sgd", loss="mse")
    assert parallel.jit_compile is True


def test_the_template_variables_are_replicated_on_the_devices():
    template = normalized_mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=["/cpu:1", "/cpu:2"])
    sharding = template.trainable_variables[0].value.sharding
    assert sharding.is_fully_replicated
    assert {d.id for d in sharding.device_set} == {1, 2}
    assert parallel.devices == ["/device:CPU:1", "/device:CPU:2"]


def test_nothing_on_the_jax_path_starts_tensorflow():
    # TensorFlow is installed (and imported) beside JAX, but training,
    # evaluating, predicting and saving on JAX never start its runtime.
    from multigpu import tensorflow_internals

    parallel = compiled(multigpu.multi_gpu_model(normalized_mlp(), gpus=4), "adam")
    x, y = rows_of(10)
    parallel.fit(x, y, batch_size=4, epochs=1, verbose=0)
    parallel.evaluate(x, y, verbose=0)
    parallel.predict(x, verbose=0)
    assert not tensorflow_internals.tensorflow_started()


def test_every_device_by_default_and_the_data_checked_as_on_tensorflow():
    multigpu.devices.STATE.reset()  # the warning is given once per process
    with pytest.warns(UserWarning, match="No GPU found"):
        parallel = multigpu.multi_gpu_model(normalized_mlp())
    assert parallel.devices == [f"/device:CPU:{i}" for i in range(4)]
    compiled(parallel, "sgd")
    x, y = rows_of(10)
    with pytest.raises(ValueError, match="Invalid `batch_size`"):
        parallel.fit(x, y, batch_size=-1, verbose=0)


def test_later_epochs_compile_nothing_and_dividing_batches_arrive_split():
    # Each epoch resets the metrics; the step still receives its state
    # whole on every device, so the step compiled in the first epoch serves
    # the next ones. A batch whose rows divide arrives split, each device
    # its rows; one that does not arrives whole, for the step to split.
    parallel = compiled(multigpu.multi_gpu_model(normalized_mlp(), gpus=4), "adam")
    x, y = rows_of(32)
    parallel.fit(x, y, batch_size=16, epochs=1, verbose=0)
    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        parallel.fit(x, y, batch_size=16, epochs=2, verbose=0)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == []
    even, uneven = mesh_lib.put_batch((x[:8], x[:10]), parallel.mesh)
    assert even.sharding.shard_shape(even.shape) == (2, 6)
    assert uneven.sharding.is_fully_replicated
