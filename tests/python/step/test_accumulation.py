"""Keras's gradient accumulation and `fit`'s arguments on the engines."""

import keras
import numpy as np
import pytest

import multigpu
from conftest import DEVICES
from support.models import copy_of, data, max_weight_difference, mlp

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]

ENGINES = ("replicate", "mirrored")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("check_finite", [True, False])
def test_accumulated_batches_equal_one_step_on_the_larger_batch(
        rng, engine, check_finite):
    """Keras's `gradient_accumulation_steps=k` on `k` batches: one step on
    their rows, and `iterations` counts that one update (Keras's count)."""
    template = mlp()
    reference = copy_of(template)
    x, y = data(rng, 48)
    parallel = multigpu.multi_gpu_model(template, gpus=DEVICES, engine=engine)
    parallel.check_finite = check_finite
    parallel.compile(loss="mse", optimizer=keras.optimizers.SGD(
        0.2, momentum=0.5, gradient_accumulation_steps=3))
    parallel.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    reference.compile(optimizer=keras.optimizers.SGD(0.2, momentum=0.5),
                      loss="mse")
    reference.fit(x, y, batch_size=24, epochs=1, shuffle=False, verbose=0)
    assert max_weight_difference(template, copy_of(mlp())) > 1e-3  # trained
    assert max_weight_difference(template, reference) < 1e-5
    assert int(np.asarray(parallel.optimizer.iterations)) == 2


class _Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)


@pytest.mark.parametrize("engine", ENGINES)
def test_fit_takes_its_callbacks_by_position_too(rng, engine):
    """`fit(x, y, batch_size, epochs, verbose, callbacks)`, as Keras's."""
    template = mlp()
    x, y = data(rng, 16)
    parallel = multigpu.multi_gpu_model(template, gpus=DEVICES, engine=engine)
    parallel.compile(optimizer="sgd", loss="mse")
    recorder = _Epochs()
    before = template.get_weights()
    parallel.fit(x, y, 8, 2, 0, [recorder])
    assert recorder.epochs == [0, 1]
    # The template holds what was trained.
    assert max(np.abs(a - b).max()
               for a, b in zip(template.get_weights(), before)) > 0
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=1e-6)
