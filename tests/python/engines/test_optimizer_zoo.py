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
A model all in float16 (its outputs too), trained with a learning rate
that moves its weights, takes on 4 devices the steps one device takes
(`MIXED_RUNS`).
"""

import functools

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


@pytest.mark.zoo(axes=("engine",))
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


@functools.cache
def _mixed_alone():
    return zoo.fit_mixed(zoo.mixed_model())


@pytest.mark.parametrize("engine", ENGINES)
def test_mixed_float16_skips_the_steps_one_device_skips(engine,
                                                        mixed_float16):
    parallel = multigpu.multi_gpu_model(zoo.mixed_model(), gpus=zoo.DEVICES,
                                        engine=engine)
    zoo.check_same_skipped_steps(_mixed_alone(), zoo.fit_mixed(parallel))


@functools.cache
def _float16_alone(run):
    return zoo.fit_float16(zoo.float16_model(), run)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("run", list(zoo.MIXED_RUNS))
def test_a_float16_model_trains_as_on_one_device(run, engine, mixed_float16):
    parallel = multigpu.multi_gpu_model(
        zoo.float16_model(), gpus=zoo.MIXED_DEVICES, engine=engine)
    zoo.check_float16_as_on_one_device(_float16_alone(run),
                                       zoo.fit_float16(parallel, run))
