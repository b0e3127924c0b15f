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
A model all in float16 (its outputs too), trained with a learning rate
that moves its weights, takes on 4 devices the steps one device takes
(`MIXED_RUNS`).
Like the rest of this folder, these tests need a process started with
`KERAS_BACKEND=jax` (conftest.py).
"""

import functools

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


# A zoo of one engine: every case runs in the gate too (support/tiers.py);
# a second JAX engine would be its axis.
@pytest.mark.zoo(axes=())
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


def test_mixed_float16_skips_the_steps_one_device_skips(mixed_float16):
    alone = zoo.fit_mixed(zoo.mixed_model())
    parallel = multigpu.multi_gpu_model(zoo.mixed_model(), gpus=zoo.DEVICES,
                                        engine="jax")
    zoo.check_same_skipped_steps(alone, zoo.fit_mixed(parallel))


@pytest.mark.parametrize("run", list(zoo.MIXED_RUNS))
def test_a_float16_model_trains_as_on_one_device(run, mixed_float16):
    alone = zoo.fit_float16(zoo.float16_model(), run)
    parallel = multigpu.multi_gpu_model(
        zoo.float16_model(), gpus=zoo.MIXED_DEVICES, engine="jax")
    zoo.check_float16_as_on_one_device(alone, zoo.fit_float16(parallel, run))
