"""The NaN/inf guard on the JAX engine, against one device.

A batch with NaN or inf stops `fit` with `NonFiniteInputError` naming the
epoch, the batch and the input, and the model is left as one device leaves
it after the batches before: weights, BatchNormalization's statistics,
the optimizer's variables and the metrics. The TensorFlow engines' guard
is `tests/python/step/test_nonfinite.py`'s.
"""

import keras
import numpy as np
import pytest

import multigpu
from support.models import copy_of, normalized_mlp

TOLERANCE = 1e-5
ROWS, BATCH = 40, 8  # 5 batches an epoch


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((ROWS, 6)).astype("float32"),
            rng.standard_normal((ROWS, 3)).astype("float32"))


def _compiled(model, steps_per_execution=1):
    model.compile(optimizer="adam", loss="mse", metrics=["mae"],
                  steps_per_execution=steps_per_execution)
    return model


def _state(model):
    return ([np.array(v) for v in model.variables]
            + [np.array(v) for v in model.optimizer.variables])


# (epoch, batch) of the bad row, both 1-based, and steps_per_execution: the
# middle of the first epoch; the first batch of the fit and of the second
# epoch (Keras's JAX trainer takes the variables' values out of the model
# at each epoch's start, and puts back the latest state when `fit` ends,
# which a fit that fails in its first call has not made); the second batch
# of a call of two steps (the call stops before its first).
CASES = {"mid_epoch": (1, 3, 1), "fit_start": (1, 1, 1),
         "epoch_start": (2, 1, 1), "second_of_a_call": (1, 4, 2)}


def batches(x, y, bad_epoch, bad_batch):
    """Batches of (x, y) in order, epoch after epoch; one goes bad once.

    Row 2 of x gets a NaN and row 3 of y an inf in batch `bad_batch` of
    epoch `bad_epoch` (1-based), and in no other epoch.
    """
    per_epoch = ROWS // BATCH
    for n in range(10 * per_epoch):
        epoch, index = divmod(n, per_epoch)
        rows = slice(index * BATCH, (index + 1) * BATCH)
        xs, ys = x[rows].copy(), y[rows].copy()
        if (epoch + 1, index + 1) == (bad_epoch, bad_batch):
            xs[2, 4] = np.nan
            ys[3, 0] = np.inf
        yield xs, ys


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_batch_stops_fit_with_one_devices_state_before_it(case):
    epoch, batch, steps = CASES[case]
    x, y = _data()
    keras.utils.set_random_seed(3)
    template = normalized_mlp()
    alone = _compiled(copy_of(template))
    parallel = _compiled(multigpu.multi_gpu_model(template, gpus=2), steps)
    assert parallel.check_finite  # on by default, as on TensorFlow

    with pytest.raises(multigpu.NonFiniteInputError) as raised:
        parallel.fit(batches(x, y, epoch, batch), epochs=3,
                     steps_per_epoch=ROWS // BATCH, verbose=0)
    error = raised.value
    assert (error.epoch, error.step) == (epoch - 1, batch - 1)
    assert error.inputs == ["x", "y"]
    assert str(error).startswith(
        f"Non-finite training data in epoch {epoch}, batch {batch} (counted "
        "from 1): x has 1 NaN value in 1 row (row 2 of the batch, counted "
        "from 0); y has 1 inf value in 1 row (row 3 of the batch")
    assert "set model.check_finite = False" in str(error)

    # One device trained on the batches before the bad one; a call of two
    # steps that holds it trains on neither.
    trained = (epoch - 1) * (ROWS // BATCH) + batch - 1
    trained -= (batch - 1) % steps
    if trained:
        alone.fit(np.concatenate([x] * epoch)[:trained * BATCH],
                  np.concatenate([y] * epoch)[:trained * BATCH],
                  batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    else:
        alone.optimizer.build(alone.trainable_variables)
    assert int(parallel.optimizer.iterations.numpy()) == trained
    for got, want in zip(_state(parallel.template), _state(alone)):
        np.testing.assert_allclose(got, want, atol=TOLERANCE)

    # The good data trains on, from where training stopped.
    history = parallel.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                           verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_named_inputs_and_sample_weights_are_named():
    inputs = {"a": keras.Input((2,), name="a"), "b": keras.Input((4,), name="b")}
    outputs = keras.layers.Dense(3)(keras.layers.Concatenate()(
        [inputs["a"], inputs["b"]]))
    parallel = _compiled(multigpu.multi_gpu_model(
        keras.Model(inputs, outputs), gpus=2))
    x, y = _data()
    weights = np.ones(ROWS, "float32")
    weights[9] = np.nan
    features = {"a": x[:, :2], "b": x[:, 2:]}
    features["b"][[12, 14], 1] = -np.inf
    with pytest.raises(multigpu.NonFiniteInputError) as raised:
        parallel.fit(features, y, sample_weight=weights, batch_size=BATCH,
                     shuffle=False, verbose=0)
    assert raised.value.inputs == ["x['b']", "sample_weight"]
    assert ("x['b'] has 2 inf values in 2 rows (rows 4, 6 of the batch"
            in str(raised.value))
    assert "epoch 1, batch 2" in str(raised.value)


def test_unchecked_the_weights_turn_nan():
    x, y = _data()
    x[3, 0] = np.nan
    parallel = _compiled(multigpu.multi_gpu_model(normalized_mlp(), gpus=2))
    parallel.check_finite = False
    parallel.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert np.isnan(parallel.get_weights()[0]).all()
    with pytest.raises(ValueError, match="Invalid `check_finite`"):
        parallel.check_finite = "yes"
