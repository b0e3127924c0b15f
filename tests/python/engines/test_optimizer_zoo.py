"""The optimizer zoo on the TensorFlow engines, differentially.

Every `keras.optimizers` class and each option of Keras's optimizers
(`support/optimizer_zoo.py`: clipping three ways, the moving average,
weight decay, a schedule, gradient accumulation alone and combined, a
`LossScaleOptimizer`, a `MultiOptimizer`; the engines build the optimizer
themselves) trains the zoo's model through
each engine on 2 devices, on an epoch of batches that split evenly,
unevenly and leave a device without rows, and ends within `TOL` of the
same model trained by plain Keras on one device, its logged losses too.
Under `mixed_float16`, a batch one replica's share of which overflows is
skipped on every replica, as one device skips it.
"""

import functools

import keras
import numpy as np
import pytest

import multigpu
from support import optimizer_zoo as zoo

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")

ENGINES = ("replicate", "mirrored")


@functools.cache
def _alone(name):
    # One reference per case and test worker, for both engines.
    return zoo.train_alone(name)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", list(zoo.CASES))
def test_an_optimizer_trains_as_on_one_device(name, engine):
    weights, losses = _alone(name)
    template = zoo.model()
    parallel = multigpu.multi_gpu_model(template, gpus=zoo.DEVICES,
                                        engine=engine)
    ours = zoo.fit(parallel, zoo.CASES[name])
    assert zoo.max_difference(template.get_weights(), weights) < zoo.TOL
    np.testing.assert_allclose(ours, losses, rtol=zoo.TOL, atol=zoo.TOL)


def _overflowing_data():
    """Batches of 4 rows whose last row (the second device's) overflows.

    The targets of every fourth row are 3,000 times the others: under a
    loss scale of 2**15 its gradient overflows float16 in the hidden
    layer's backward pass, while the first device's share stays finite.
    """
    x, y = zoo.data()
    x, y = x[:8], y[:8].copy()
    y[3::4] *= 3e3
    return x, y


def _mixed_model():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((zoo.INPUT_DIM,))
    hidden = keras.layers.Dense(6, activation="tanh")(inputs)
    # The output in float32, as Keras's mixed-precision guide advises.
    outputs = keras.layers.Dense(2, dtype="float32")(hidden)
    return keras.Model(inputs, outputs)


def _fit_mixed(model, x, y):
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    history = model.fit(x, y, batch_size=4, epochs=3, shuffle=False,
                        verbose=0)
    return history.history["loss"]


@pytest.fixture
def mixed_float16():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy(previous)


@functools.cache
def _mixed_alone():
    x, y = _overflowing_data()
    reference = _mixed_model()
    losses = _fit_mixed(reference, x, y)
    return (reference.get_weights(), losses,
            float(reference.optimizer.dynamic_scale.numpy()))


@pytest.mark.parametrize("engine", ENGINES)
def test_mixed_float16_skips_the_steps_one_device_skips(engine,
                                                        mixed_float16):
    weights, losses, scale = _mixed_alone()
    x, y = _overflowing_data()
    template = _mixed_model()
    parallel = multigpu.multi_gpu_model(template, gpus=zoo.DEVICES,
                                        engine=engine)
    ours = _fit_mixed(parallel, x, y)
    assert isinstance(parallel.optimizer, keras.optimizers.LossScaleOptimizer)
    # Some steps were skipped (the scale came down from 2**15) ...
    assert scale < 2.0**15
    # ... the same ones: the same scale, and weights that stayed finite.
    assert float(parallel.optimizer.dynamic_scale.numpy()) == scale
    assert all(np.all(np.isfinite(w)) for w in template.get_weights())
    # Within float16's rounding of the forward and backward pass.
    assert zoo.max_difference(template.get_weights(), weights) < 1e-3
    np.testing.assert_allclose(ours, losses, rtol=1e-3)
