"""A failed `fit` frees its input iterator before it raises: nothing freezes later.

When `fit` raises (a NaN batch stopped by the guard, an exception in a
callback, an interrupt), Keras's epoch iterator stays in a reference cycle
and in the frames of the error, which an R session or a notebook keeps.
Freed later by a garbage collection, its tf.data iterator can wait up to a
minute for its threads (docs/ci.md). `TemplateBacked.fit` frees it before
the error leaves `fit`.
"""

import gc
import sys
import time
import weakref

import keras
import numpy as np
import pytest
from process_idle import IdleTime

import multigpu
from conftest import DEVICES
from multigpu.step import train_function as chain
from multigpu.step.nonfinite import NonFiniteInputError
from support.models import RaisesAtSecondBatch, copy_of, max_weight_difference

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")

ERRORS = {"nan": NonFiniteInputError, "callback": RuntimeError,
          "interrupt": KeyboardInterrupt}
# Bounds on a stall, not speed targets. Freeing an aged iterator leaves
# the whole process asleep, waiting on its autotuning thread's timer, whose
# period grows with the iterator's age (docs/tf-data-stall.md): 0.2 to
# 1.5 s here for iterators left to the collector, up to 60 s in CI's logs.
# The bounds are on that sleep (`IdleTime`), not on wall time, which a busy
# machine stretches too (beside the other test worker, a fit of 0.6 s once
# took 5.5 s). A collection sleeps under 0.05 s: STALL. A fit frees its
# own iterator at its epoch's end, which TensorFlow's race can stall for
# up to the timer's period, under twice the iterator's age (a fit of 2.1 s
# busy slept 4.6 s beside two busy processes): HANG plus twice the fit's
# busy time. The exact check is the test above: the iterators are gone
# before the error is raised.
STALL = 0.5
HANG = 2.0


def _model(engine):
    template = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                                 keras.layers.Dense(1)])
    parallel = multigpu.multi_gpu_model(template, gpus=DEVICES, engine=engine)
    parallel.compile(optimizer="sgd", loss="mse")
    return parallel


def _data(rng):
    return (rng.standard_normal((32, 4)).astype("float32"),
            rng.standard_normal((32, 1)).astype("float32"))


def _failed_fit(parallel, how, x, y):
    """A `fit` that fails in its second batch, `how`; returns its error."""
    callbacks = []
    if how == "nan":
        x = x.copy()
        x[8 + 3, 0] = np.nan
    else:
        callbacks = [RaisesAtSecondBatch(ERRORS[how]("stopped by a callback"))]
    with pytest.raises(ERRORS[how]) as caught:
        parallel.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                     callbacks=callbacks)
    return caught.value


def _tf_data_handles(iterator):
    """The resource handles of the tf.data iterators inside `fit`'s iterator."""
    workers = getattr(iterator, "_iterators", None)
    owned = [w._iterator for w in workers] if workers else [iterator]
    handles = []
    for one in owned:
        devices = getattr(one, "_device_iterators", None)
        if devices is None:
            handles.append(one._iterator_resource)
        else:
            handles.append(one._multi_device_iterator_resource)
            handles += [d._iterator_resource for d in devices]
    return handles


# A zoo along the engines: the gate runs each way to fail on one engine,
# in turn, the full tier on both (support/tiers.py).
@pytest.mark.zoo(axes=("engine",))
@pytest.mark.parametrize("how", sorted(ERRORS))
@pytest.mark.parametrize("engine", ["mirrored", "replicate"])
def test_a_failed_fit_frees_its_tf_data_iterator_before_it_raises(
        engine, how, rng):
    parallel = _model(engine)
    x, y = _data(rng)
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)
    handles = []

    def watched(train_function):
        def train(iterator):
            handles[:] = [weakref.ref(h) for h in _tf_data_handles(iterator)]
            return train_function(iterator)

        return train

    # A probe in the place of the outermost link: it sees the iterator
    # `fit` passes (registered before the fit, it outlasts the fit's end).
    chain.link(parallel, "resume", watched)
    error = _failed_fit(parallel, how, x, y)
    assert handles
    # The error (and its frames) is still alive, as in a session that
    # shows it; the iterators it refers to hold no tf.data iterator.
    assert [h() for h in handles] == [None] * len(handles)
    assert error.__traceback__ is not None


# Bounds on sleep that a loaded machine can still cross (a gate run beside
# two busy processes did): the full tier's, where the steps run one at a
# time. The gate keeps the exact check above.
@pytest.mark.full
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="IdleTime reads each thread's state from Linux's /proc")
def test_after_three_failed_fits_collecting_and_fitting_again_do_not_hang(rng):
    parallel = _model("mirrored")
    x, y = _data(rng)
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)
    took = {}
    for how in ("nan", "callback", "interrupt"):
        error = _failed_fit(parallel, how, x, y)
        # The iterator ages while the session shows the error.
        time.sleep(1)
        del error
        with IdleTime() as collecting:
            gc.collect()
        reference = copy_of(parallel.template)
        reference.compile(optimizer="sgd", loss="mse")
        with IdleTime() as fitting:
            history = parallel.fit(x, y, batch_size=8, epochs=1,
                                   shuffle=False, verbose=0)
        took[how] = {"collect": (collecting.idle, collecting.wall),
                     "fit": (fitting.idle, fitting.wall)}
        # What it trained is what the template trains alone on one device.
        want = reference.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                             verbose=0)
        np.testing.assert_allclose(history.history["loss"],
                                   want.history["loss"], rtol=1e-5)
        assert max_weight_difference(parallel.template, reference) < 1e-5
    # (idle, wall) seconds of each collection and fit.
    assert all(step["collect"][0] < STALL for step in took.values()), took
    assert all(idle < HANG + 2 * (wall - idle)
               for idle, wall in (step["fit"] for step in took.values())), took
