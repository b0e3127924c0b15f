"""The optimizer zoo on the JAX engine, differentially.

Every `keras.optimizers` class and each option of Keras's optimizers
(`support/optimizer_zoo.py`: clipping three ways, the moving average,
weight decay, a schedule, gradient accumulation alone and combined, a
`LossScaleOptimizer`, a `MultiOptimizer`) trains the zoo's model through
the JAX engine on 2 devices, on an epoch of batches that split evenly,
unevenly and leave a device without rows, and ends within `TOL` of the
same model trained by plain Keras on one device: its weights, its logged
losses and its optimizer's variables. Under `mixed_float16`, a batch one
device's share of which overflows is skipped as one device skips it.
Like the rest of this folder, these tests need a process started with
`KERAS_BACKEND=jax` (conftest.py).
"""

import functools

import keras
import numpy as np
import pytest

import multigpu
from support import optimizer_zoo as zoo

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")


def _trained(model, name):
    # The optimizer built before `fit`, as `zoo.train_alone` builds it (on
    # JAX, Keras's `fit` builds it eagerly before the first step anyway).
    losses = zoo.fit(model, zoo.CASES[name], build=True)
    return (model.get_weights(), losses,
            [np.asarray(v.value) for v in model.optimizer.variables])


@functools.cache
def _alone(name):
    """`zoo.train_alone(name)` and the optimizer's variables, once per case."""
    return _trained(zoo.model(), name)


@pytest.mark.parametrize("name", list(zoo.CASES))
def test_an_optimizer_trains_as_on_one_device(name):
    weights, losses, state = _alone(name)
    parallel = multigpu.multi_gpu_model(zoo.model(), gpus=zoo.DEVICES,
                                        engine="jax")
    ours, our_losses, our_state = _trained(parallel, name)
    assert zoo.max_difference(ours, weights) < zoo.TOL
    np.testing.assert_allclose(our_losses, losses, rtol=zoo.TOL, atol=zoo.TOL)
    assert len(our_state) == len(state)
    assert zoo.max_difference(our_state, state) < zoo.TOL


def _overflowing_data():
    """The zoo's epoch with rows whose float16 gradients overflow.

    The targets of rows 3 and 8 are 3,000 times the others: row 3 is the
    second device's share of the 4-row batch (2 + 2 rows), row 8 of the
    5-row batch (3 + 2 rows); the 1-row batch stays finite. Under a loss
    scale of 2**15 their gradient overflows float16 in the hidden layer's
    backward pass, while the first device's share stays finite.
    """
    x, y = zoo.data()
    y = y.copy()
    y[[3, 8]] *= 3e3
    return zoo.Batches(x, y)


def _mixed_model():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((zoo.INPUT_DIM,))
    hidden = keras.layers.Dense(6, activation="tanh")(inputs)
    # The output in float32, as Keras's mixed-precision guide advises.
    outputs = keras.layers.Dense(2, dtype="float32")(hidden)
    return keras.Model(inputs, outputs)


def _fit_mixed(model):
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    history = model.fit(_overflowing_data(), epochs=3, shuffle=False,
                        verbose=0)
    optimizer = model.optimizer
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    return (model.get_weights(), history.history["loss"],
            float(optimizer.dynamic_scale),
            int(optimizer.inner_optimizer.iterations))


@pytest.fixture
def mixed_float16():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy(previous)


def test_mixed_float16_skips_the_steps_one_device_skips(mixed_float16):
    weights, losses, scale, applied = _fit_mixed(_mixed_model())
    parallel = multigpu.multi_gpu_model(_mixed_model(), gpus=zoo.DEVICES,
                                        engine="jax")
    ours, our_losses, our_scale, our_applied = _fit_mixed(parallel)
    # Some of the 9 steps were skipped (the scale came down from 2**15 and
    # fewer updates were applied) ...
    assert scale < 2.0**15 and 0 < applied < 3 * len(zoo.BATCHES)
    # ... the same ones: the same scale and count of updates, and weights
    # that stayed finite.
    assert (our_scale, our_applied) == (scale, applied)
    assert all(np.all(np.isfinite(w)) for w in ours)
    # Within float16's rounding of the forward and backward pass.
    assert zoo.max_difference(ours, weights) < 1e-3
    np.testing.assert_allclose(our_losses, losses, rtol=1e-3)
    assert keras.config.dtype_policy().name == "mixed_float16"
