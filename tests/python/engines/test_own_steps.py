"""A model whose class brings its own step is refused, never trained with Keras's."""

import keras
import numpy as np
import pytest

import multigpu
from multigpu import messages
from multigpu.engines import own_steps


class CustomStep(keras.Model):
    """keras.io's pattern: a functional model with a `train_step` of its own."""

    def train_step(self, data):
        x, y = data
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.abs(self(x, training=True) - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"custom": loss}


class CustomTest(keras.Model):
    def test_step(self, data):
        return {"checked": keras.ops.zeros(())}


class CustomLoss(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                     training=True):
        return keras.ops.mean(keras.ops.abs(y_pred - y))


class CustomPredict(keras.Model):
    def predict_step(self, data):
        return super().predict_step(data) * 2.0


class CustomMetrics(keras.Model):
    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return {"own": keras.ops.mean(y_pred)}


def _functional(cls):
    inputs = keras.Input((4,), name="features")
    outputs = keras.layers.Dense(2, name="scores")(inputs)
    return cls(inputs, outputs, name="own")


def _subclassed():
    class Subclassed(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

        def test_step(self, data):
            return super().test_step(data)

    model = Subclassed(name="sub")
    model(np.zeros((1, 4), "float32"))
    return model


@pytest.mark.parametrize(("model", "methods"), [
    (lambda: _functional(CustomStep), ["train_step"]),
    (lambda: _functional(CustomTest), ["test_step"]),
    (lambda: _functional(CustomLoss), ["compute_loss"]),
    (lambda: _functional(CustomPredict), ["predict_step"]),
    (lambda: _functional(CustomMetrics), ["compute_metrics"]),
    (_subclassed, ["test_step"]),
], ids=["train_step", "test_step", "compute_loss", "predict_step",
        "compute_metrics", "subclassed"])
@pytest.mark.parametrize("engine", ["auto", "replicate", "mirrored"])
def test_every_engine_refuses_a_model_with_its_own_step(model, methods,
                                                          engine):
    model = model()
    assert own_steps.overridden_steps(model) == methods
    with pytest.raises(ValueError) as caught:
        multigpu.multi_gpu_model(model, gpus=4, engine=engine)
    message = str(caught.value)
    assert "Invalid `model`" in message
    assert f"`{methods[0]}`" in message
    assert "multigpu.mirrored_strategy().scope()" in message


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="TensorFlow's trainer calls no JAX hook")
def test_jax_hooks_count_only_on_jax():
    """TensorFlow's trainer calls neither hook, on one device or many."""

    class JaxHooks(keras.Model):
        def compute_loss_and_updates(self, *args, **kwargs):
            raise AssertionError("never called on TensorFlow")

        def stateless_compute_loss(self, *args, **kwargs):
            raise AssertionError("never called on TensorFlow")

    assert own_steps.step_methods() == own_steps.STEP_METHODS
    assert own_steps.overridden_steps(_functional(JaxHooks)) == []


def test_model_parallel_refuses_a_model_with_its_own_step():
    with pytest.raises(ValueError, match="`train_step`"):
        multigpu.model_parallel(_functional(CustomStep), devices=2)


def test_the_refusal_reads_in_r():
    with messages.language("r"):
        with pytest.raises(ValueError) as caught:
            own_steps.check_standard_steps(_functional(CustomStep),
                                           "multi_gpu_model")
    message = str(caught.value)
    assert "multi_gpu_model()" in message and "multigpu." not in message
    assert "with(mirrored_strategy()$scope(), {...})" in message
    assert '"own"' in message


@pytest.mark.parametrize("factory", [
    lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
    lambda: _functional(keras.Model),
])
def test_standard_models_have_no_step_of_their_own(factory):
    assert own_steps.overridden_steps(factory()) == []


def test_the_advised_strategy_runs_the_model_s_own_step(rng):
    """What the error advises: Keras's fit in the scope runs `train_step`."""
    x = rng.standard_normal((16, 4)).astype("float32")
    y = rng.standard_normal((16, 2)).astype("float32")
    with multigpu.mirrored_strategy(2).scope():
        mirrored = _functional(CustomStep)
        mirrored.compile(optimizer=keras.optimizers.SGD(0.1))
    history = mirrored.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                           verbose=0).history
    assert list(history) == ["custom"]
    assert history["custom"][-1] < history["custom"][0]
