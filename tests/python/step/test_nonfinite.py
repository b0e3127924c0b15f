"""The engines stop training on NaN or inf in a batch, naming where it is."""

import keras
import numpy as np
import pytest

import multigpu
from conftest import DEVICES
from multigpu.messages import language
from multigpu.step.nonfinite import NonFiniteInputError
from support.models import (
    ZOO,
    copy_of,
    data,
    max_weight_difference,
    mlp,
    zoo_batch,
)

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]

def _engine_model(template, engine):
    if engine == "model_parallel":
        model = multigpu.model_parallel(template, DEVICES[:2])
    else:
        model = multigpu.multi_gpu_model(template, gpus=DEVICES, engine=engine)
    assert model.check_finite is True  # the default
    return model


def _compiled(engine, template=None):
    model = _engine_model(template or mlp(), engine)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _finite(model):
    return all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.parametrize("engine, bad", [
    ("replicate", np.nan), ("mirrored", np.inf), ("model_parallel", np.nan)])
def test_a_bad_value_in_x_stops_fit_at_its_batch(rng, engine, bad):
    x, y = data(rng, 48)  # batches of 16: 3 per epoch
    x[16 + 5, 2] = bad  # epoch 1, batch 2, row 5
    model = _compiled(engine)
    with pytest.raises(NonFiniteInputError) as caught:
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    kind = "NaN" if np.isnan(bad) else "inf"
    message = str(caught.value)
    assert message.startswith(
        "Non-finite training data in epoch 1, batch 2 (counted from 1): "
        f"x has 1 {kind} value in 1 row (row ")
    row = "row 5 of the batch" if engine != "mirrored" else (
        "row 1 of replica 2 of 4's share of the batch")  # 4 rows a replica
    assert row in message
    assert "set model.check_finite = False" in message
    assert (caught.value.epoch, caught.value.step) == (0, 1)
    assert caught.value.inputs == ["x"]
    assert isinstance(caught.value, ValueError)
    # The bad batch changed nothing: one step taken, the weights finite.
    assert model.optimizer.iterations.numpy() == 1
    assert _finite(model)


# Each zoo model on one engine, the engines in turn. MobileNet (65 s a
# case) is left to the zoo's slow sweep. The CNN's BatchNormalization and
# Dropout write state in the forward pass; the Embedding model reads its
# inputs as indices.
ZOO_ENGINES = {
    name: ("replicate", "mirrored", "model_parallel")[i % 3]
    for i, name in enumerate(n for n in ZOO if n != "application")}
ZOO_ENGINES["subclassed"] = "replicate"  # model_parallel needs layers


def _state(model):
    return [np.array(v) for v in model.variables + model.optimizer.variables]


@pytest.mark.parametrize("name, engine", sorted(ZOO_ENGINES.items()))
def test_a_bad_batch_changes_no_variable_of_any_zoo_model(rng, name, engine):
    """Weights, BatchNormalization's statistics, Dropout's seed, the
    optimizer's slots and iteration count: all as before the bad batch.

    Every write of each model's step waits for the check's assertion
    (`multigpu.step.train_step`), whatever its layers write.
    """
    template = ZOO[name]()
    model = _engine_model(template, engine)
    model.compile(optimizer="adam", loss="mse")
    x, y = zoo_batch(template, rng, 8)
    model.train_on_batch(x, y)
    before = _state(model)
    floats = [t for t in keras.tree.flatten(x) if t.dtype.kind == "f"]
    bad = (floats or keras.tree.flatten(y))[0]
    bad.reshape(-1)[len(bad.reshape(-1)) // 2] = np.nan
    with pytest.raises(NonFiniteInputError):
        model.train_on_batch(x, y)
    for got, want in zip(_state(model), before):
        np.testing.assert_array_equal(got, want)
    assert model.optimizer.iterations.numpy() == 1


def _float_token_ids():
    """An Embedding fed floats, as R's numeric token ids arrive."""
    tokens = keras.Input((4,), name="tokens")  # float32
    hidden = keras.layers.Flatten()(keras.layers.Embedding(10, 2)(tokens))
    return keras.Model(tokens, keras.layers.Dense(3)(hidden))


@pytest.mark.parametrize("case", ["float_token_ids", "sparse_labels"])
@pytest.mark.parametrize("engine, eagerly", [
    ("replicate", False), ("mirrored", False), ("replicate", True)])
def test_a_nan_that_would_be_an_index_is_reported_as_nan(
        rng, case, engine, eagerly):
    """A NaN cast to an integer is an index out of range, which the gather
    or the loss would report in TensorFlow's words: in a traced step it is
    cast as zero, and run eagerly the verdict comes first."""
    if case == "float_token_ids":
        template = _float_token_ids()
        x = rng.integers(0, 10, (16, 4)).astype("float32")
        y = rng.standard_normal((16, 3)).astype("float32")
        x[9, 2], loss, label = np.nan, "mse", "x"
    else:
        template = mlp()
        x = rng.standard_normal((16, 8)).astype("float32")
        y = rng.integers(0, 3, (16, 1)).astype("float32")
        y[9, 0], loss, label = np.nan, "sparse_categorical_crossentropy", "y"
    model = _engine_model(template, engine)
    model.compile(optimizer="sgd", loss=loss, run_eagerly=eagerly)
    for _ in range(3):  # a race would show within a few steps
        with pytest.raises(NonFiniteInputError, match=(
                f"{label} has 1 NaN value in 1 row")):
            model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert model.optimizer.iterations.numpy() == 0


def test_plain_keras_trains_into_nan_without_a_word(rng):
    """What the guard prevents: Keras itself trains the weights into NaN."""
    x, y = data(rng, 32)
    x[3, 0] = np.nan
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert not _finite(model)


def _two_inputs():
    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b")
    merged = keras.layers.Concatenate()([a, b])
    out = keras.layers.Dense(1, name="out")(merged)
    aux = keras.layers.Dense(1, name="aux")(merged)
    return keras.Model({"a": a, "b": b}, [out, aux], name="two_inputs")


def test_named_inputs_labels_and_sample_weights_are_each_named(rng):
    rows = 16
    x = {"a": rng.standard_normal((rows, 3)).astype("float32"),
         "b": rng.standard_normal((rows, 2)).astype("float32")}
    y = [rng.standard_normal((rows, 1)).astype("float32") for _ in range(2)]
    x["b"][9, 1] = np.inf
    y[1][[2, 4, 6, 8, 10, 12]] = np.nan
    model = multigpu.multi_gpu_model(_two_inputs(), gpus=DEVICES[:2])
    model.check_finite = True
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(NonFiniteInputError) as caught:
        model.fit(x, y, batch_size=rows, epochs=1, shuffle=False, verbose=0)
    message = str(caught.value)
    assert caught.value.inputs == ["x['b']", "y[1] ('aux')"]
    assert "x['b'] has 1 inf value in 1 row (row 9 of the batch" in message
    assert ("y[1] ('aux') has 6 NaN values in 6 rows (rows 2, 4, 6, 8, 10, "
            "... of the batch") in message
    # The same error in R spelling (the R package renders messages in R).
    with language("r"), pytest.raises(NonFiniteInputError) as caught:
        model.fit(x, y, batch_size=rows, epochs=1, shuffle=False, verbose=0)
    assert caught.value.inputs == ["x$b", 'y[[2]] ("aux")']
    assert "set model$check_finite <- FALSE" in str(caught.value)
    weights = rng.random(rows).astype("float32")
    weights[0] = np.nan
    x["b"][9, 1], y[1][:] = 0.0, 0.0
    with pytest.raises(NonFiniteInputError, match=(
            r"sample_weight\[0\] \('out'\) has 1 NaN")):
        model.fit(x, y, sample_weight=weights, batch_size=rows, shuffle=False,
                  verbose=0)
    assert _finite(model)


def test_train_on_batch_is_guarded_too(rng):
    x, y = data(rng, 8)
    y[0, 0] = np.nan
    model = _compiled("replicate")
    with pytest.raises(NonFiniteInputError, match=(
            r"^Non-finite training data in a training batch: y has 1 NaN")):
        model.train_on_batch(x, y)
    assert _finite(model)


# The mirrored engine refuses several steps per call (keras-team/keras#19246,
# engines/test_mirrored.py).
@pytest.mark.parametrize("engine", ["replicate"])
def test_several_steps_per_execution_stop_at_the_bad_batch(rng, engine):
    """With `steps_per_execution=3` one call of the train function runs 3
    batches: the error names the bad one, and the batch after it in the
    same call is not trained either."""
    x, y = data(rng, 48)  # 6 batches of 8: calls of batches 1-3 and 4-6
    x[4 * 8 + 2, 0] = np.nan  # batch 5
    model = _engine_model(mlp(), engine)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                  steps_per_execution=3)
    with pytest.raises(NonFiniteInputError, match=(
            r"^Non-finite training data in epoch 1, batch 5 \(counted from "
            r"1\): x has 1 NaN value in 1 row")) as caught:
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert (caught.value.epoch, caught.value.step) == (0, 4)
    assert model.optimizer.iterations.numpy() == 4  # batches 1-4
    assert _finite(model)


def test_check_finite_false_turns_the_guard_off(rng):
    x, y = data(rng, 16)
    x[0, 0] = np.nan
    model = _compiled("replicate")
    assert model.check_finite is True
    with pytest.raises(NonFiniteInputError):
        model.fit(x, y, batch_size=8, verbose=0)
    model.check_finite = np.bool_(False)
    model.fit(x, y, batch_size=8, verbose=0)  # trains into NaN, as Keras
    assert not _finite(model)
    with pytest.raises(ValueError, match=(
            r"`check_finite`: received 'no'; expected True or False")):
        model.check_finite = "no"


def test_integer_inputs_and_finite_batches_train_as_before(rng):
    inputs = keras.Input((4,), dtype="int32", name="tokens")
    hidden = keras.layers.Flatten()(keras.layers.Embedding(10, 2)(inputs))
    template = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    reference = copy_of(template)
    model = multigpu.multi_gpu_model(template, gpus=DEVICES[:2])
    model.check_finite = True
    for each in (model, reference):
        each.compile(optimizer="sgd", loss="mse")
    x = rng.integers(0, 10, (16, 4)).astype("int32")
    y = np.ones((16, 1), "float32")
    got = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    want = reference.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                         verbose=0)
    np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                               rtol=1e-5)
    assert max_weight_difference(template, reference) < 1e-5
