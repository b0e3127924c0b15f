"""After a failed `fit`, training again in the same process trains as a new process.

Interactive users (an R session, a notebook) call `fit` again after one
failed: a NaN batch, an exception in a callback, an interrupt. What they
train then, on the same parallel model or on a new one, must equal what a
fresh process trains (`retraining.py`, run in a subprocess).
"""

import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import multigpu
from conftest import DEVICES
from multigpu.step.nonfinite import NonFiniteInputError
from support import retraining
from support.models import RaisesAtSecondBatch, copy_of, max_weight_difference

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    """`{engine: weights}` that a new process trains with the recipe."""
    out = tmp_path_factory.mktemp("fresh") / "weights.npz"
    subprocess.run([sys.executable, str(Path(retraining.__file__)), str(out)],
                   check=True, timeout=600)
    saved = np.load(out)
    return {engine: [saved[f"{engine}_{i}"]
                     for i in range(len(retraining.template().weights))]
            for engine in retraining.ENGINES}


def _fail(parallel, how):
    """A `fit` of `parallel` that fails in its second batch, `how`."""
    x, y = retraining.batches()
    parallel.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    callbacks, error = [], {"nan": NonFiniteInputError,
                            "callback": RuntimeError,
                            "interrupt": KeyboardInterrupt}[how]
    if how == "nan":
        x = x.copy()
        x[retraining.BATCH + 3, 0] = np.nan
    else:
        callbacks = [RaisesAtSecondBatch(error("stopped by a callback"))]
    with pytest.raises(error):
        parallel.fit(x, y, batch_size=retraining.BATCH, epochs=2,
                     shuffle=False, verbose=0, callbacks=callbacks)


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("how", ["nan", "callback", "interrupt"])
@pytest.mark.parametrize("engine", retraining.ENGINES)
def test_fit_after_a_failed_fit_trains_as_a_fresh_process(
        fresh_process, engine, how):
    template = retraining.template()
    initial = template.get_weights()
    devices = DEVICES[:retraining.DEVICES]
    parallel = multigpu.multi_gpu_model(template, gpus=devices, engine=engine)
    _fail(parallel, how)
    # The same parallel model, its weights set back.
    parallel.set_weights(initial)
    _assert_same(retraining.train(parallel), fresh_process[engine])
    # A new parallel model of a new template.
    again = multigpu.multi_gpu_model(retraining.template(), gpus=devices,
                                     engine=engine)
    _assert_same(retraining.train(again), fresh_process[engine])


def test_a_bad_batch_leaves_the_collectives_of_the_process_working(rng):
    """A bad batch runs no step, so no all-reduce is left half done.

    A guard that fails inside the step (an assertion beside the replicas'
    gradient all-reduce) cancels the all-reduce in flight, and TensorFlow
    then aborts the process's collective executor ("StartAbort CANCELLED:
    group is cancelled"): every later step of every mirrored model in the
    process fails with `CancelledError`, and so did the mirrored tests that
    a test worker ran after such a test. The wide layers keep the
    all-reduce in flight long enough for the assertion to meet it.
    """
    wide = keras.Sequential([keras.Input((8,))] + [
        keras.layers.Dense(256, activation="relu") for _ in range(2)] + [
        keras.layers.Dense(1)])
    parallel = multigpu.multi_gpu_model(wide, gpus=DEVICES, engine="mirrored")
    parallel.compile(optimizer="sgd", loss="mse")
    x = rng.standard_normal((64, 8)).astype("float32")
    y = rng.standard_normal((64, 1)).astype("float32")
    for row in (20, 21, 37, 5, 50, 40):
        bad = x.copy()
        bad[row, 1] = np.nan
        with pytest.raises(NonFiniteInputError):
            parallel.fit(bad, y, batch_size=16, verbose=0)
    # The batches before each bad one trained: the reference starts from
    # what the template holds now.
    reference = copy_of(wide)
    reference.compile(optimizer="sgd", loss="mse")
    arguments = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
    got = parallel.fit(x, y, **arguments).history["loss"]
    want = reference.fit(x, y, **arguments).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert max_weight_difference(wide, reference) < 1e-5
