"""`compiled`: a fresh optimizer, and the compile arguments of a compiled model.

A model compiled with `compile_arguments(model)` trains as `model` does: the
proof compares both after the same steps on the same batches.
"""

import keras
import numpy as np
import pytest
from keras import ops

from multigpu.engines.compiled import compile_arguments, fresh_optimizer
from support.models import copy_of, data, max_weight_difference, mlp


class _HalvedSGD(keras.optimizers.SGD):
    """An optimizer class Keras cannot look up by name (not registered)."""

    def __init__(self, halving=True, **kwargs):
        super().__init__(**kwargs)
        self.halving = halving

    def get_config(self):
        return {**super().get_config(), "halving": self.halving}


def _squared_error(y_true, y_pred):
    """A loss function of this session that Keras cannot look up by name."""
    return ops.mean(ops.square(y_true - y_pred), axis=-1)


class _CountingMetric(keras.metrics.Mean):
    """A metric class Keras cannot look up by name (not registered)."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(ops.ones_like(y_pred[:, 0]))


def _trained(optimizer, rng):
    model = mlp()
    model.compile(optimizer=optimizer, loss="mse")
    x, y = data(rng, 8)
    model.train_on_batch(x, y)
    return model


def test_a_fresh_optimizer_has_the_config_and_none_of_the_state(rng):
    used = _trained(keras.optimizers.Adam(0.01, beta_1=0.8), rng).optimizer
    assert int(used.iterations.numpy()) == 1
    fresh = fresh_optimizer(used)
    assert type(fresh) is keras.optimizers.Adam and fresh is not used
    assert fresh.get_config() == used.get_config()
    assert not fresh.built and int(fresh.iterations.numpy()) == 0


def test_a_fresh_optimizer_keeps_a_schedule_and_an_unregistered_class():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    used = keras.optimizers.SGD(schedule, momentum=0.5)
    fresh = fresh_optimizer(used)
    assert fresh.get_config() == used.get_config()
    assert fresh.get_config()["learning_rate"]["class_name"] == (
        "ExponentialDecay")
    halved = fresh_optimizer(_HalvedSGD(halving=False, learning_rate=0.3))
    assert type(halved) is _HalvedSGD and halved.halving is False
    assert float(halved.learning_rate.numpy()) == pytest.approx(0.3)


def test_an_uncompiled_model_has_no_compile_arguments():
    assert compile_arguments(mlp()) is None


def test_a_model_compiled_with_the_arguments_trains_as_the_model(rng):
    model = mlp()
    copy = copy_of(model)
    accuracy = keras.metrics.MeanAbsoluteError(name="gap")
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=_squared_error, metrics=[accuracy])
    arguments = compile_arguments(model)
    # Objects of its own: an optimizer serves one model, metrics hold state.
    assert arguments["optimizer"] is not model.optimizer
    assert arguments["optimizer"].get_config() == model.optimizer.get_config()
    assert arguments["metrics"][0] is not accuracy
    # A loss Keras cannot look up by name is the model's own (no state).
    assert arguments["loss"] is _squared_error
    assert "jit_compile" in arguments
    copy.compile(**arguments)
    x, y = data(rng, 24)
    logs = [m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
            for m in (model, copy)]
    assert max_weight_difference(model, copy) < 1e-6
    np.testing.assert_allclose(logs[0].history["gap"],
                               logs[1].history["gap"], rtol=1e-6)


def test_metrics_that_cannot_be_rebuilt_are_named_with_the_fix():
    model = mlp(name="counted")
    model.compile(optimizer="sgd", loss="mse", metrics=[_CountingMetric()])
    with pytest.raises(ValueError, match=(
            r"^Invalid `model`: the compile configuration of 'counted' "
            r"cannot be rebuilt \(.*\)\. Register custom metrics with "
            r"keras\.saving\.register_keras_serializable\(\)\.$")):
        compile_arguments(model)
    with pytest.raises(ValueError, match=r"\. Compile the copy\.$"):
        compile_arguments(model, fix="Compile the copy.")
