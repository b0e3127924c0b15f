"""A failed `fit` frees its input iterator before it raises: nothing freezes later.

When `fit` raises (a NaN batch stopped by the guard, an exception in a
callback, an interrupt), Keras's epoch iterator stays in a reference cycle
and in the frames of the error, which an R session or a notebook keeps.
Freed later by a garbage collection, its tf.data iterator can wait up to a
minute for its threads (docs/ci.md). `TemplateBacked.fit` frees it before
the error leaves `fit`.
"""

import gc
import time
import weakref

import keras
import numpy as np
import pytest

import multigpu
from conftest import DEVICES
from multigpu.step import train_function as chain
from multigpu.step.nonfinite import NonFiniteInputError
from support.models import RaisesAtSecondBatch, copy_of, max_weight_difference

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")

ERRORS = {"nan": NonFiniteInputError, "callback": RuntimeError,
          "interrupt": KeyboardInterrupt}
# A bound on a hang, not a speed target: a collection takes well under a
# second, a stalled iterator 4 to 60 s. A mirrored fit alone takes 1 to 4 s
# on a shared 2-core machine and twice that when the other test worker is
# busy, so the fit after a failure is bounded by twice the slowest fit
# before any failure, measured beside it, plus this. The exact check is
# the test above: the iterators are gone before the error is raised.
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


def test_after_three_failed_fits_collecting_and_fitting_again_do_not_hang(rng):
    parallel = _model("mirrored")
    x, y = _data(rng)
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)
    before = []
    for _ in range(2):
        start = time.perf_counter()
        parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)
        before.append(time.perf_counter() - start)
    took = {}
    for how in ("nan", "callback", "interrupt"):
        error = _failed_fit(parallel, how, x, y)
        # The iterator ages while the session shows the error.
        time.sleep(1)
        del error
        start = time.perf_counter()
        gc.collect()
        collected = time.perf_counter() - start
        reference = copy_of(parallel.template)
        reference.compile(optimizer="sgd", loss="mse")
        start = time.perf_counter()
        history = parallel.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                               verbose=0)
        took[how] = (collected, time.perf_counter() - start)
        # What it trained is what the template trains alone on one device.
        want = reference.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                             verbose=0)
        np.testing.assert_allclose(history.history["loss"],
                                   want.history["loss"], rtol=1e-5)
        assert max_weight_difference(parallel.template, reference) < 1e-5
    assert all(c < HANG and f < 2 * max(before) + HANG
               for c, f in took.values()), (took, before)
