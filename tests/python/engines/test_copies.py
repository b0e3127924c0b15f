"""The mirrored engine's copy of a model: KerasHub tasks, session Lambdas,
adapted preprocessing, and state no copy carries.

`multigpu.engines.copies.copy_model` makes the copy the mirrored engine trains. A
KerasHub causal LM (its token embedding is also its output projection)
copies weight for weight; a `Lambda` layer written in this session is
trusted code and runs in the copy whatever globals it reads, while a saved
file holding one still loads only as Keras allows (`safe_mode`). Adapted
preprocessing layers keep their state in the copy; a layer whose state
the copy cannot get is named when the engine is built.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import multigpu
from multigpu.distribute.strategy import strategy_over
from multigpu.engines import choice as choice_lib
from multigpu.engines.copies import (
    CopyMismatch,
    copy_difference,
    copy_in_scope,
    copy_model,
    probe_batch,
)
from support.hub_models import (
    bert_text_classifier,
    gpt2_causal_lm,
    llama_causal_lm,
    token_batch,
)
from support.models import max_weight_difference

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")

TOL = 1e-6


def _with_session_lambda():
    inputs = keras.Input((4,), name="features")
    hidden = keras.layers.Dense(6, name="hidden")(inputs)
    # Reads the global `ops`: its bytecode alone would not run.
    squared = keras.layers.Lambda(lambda t: ops.square(t) / 4.0,
                                  name="squared")(hidden)
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(squared),
                       name="with_lambda")


@pytest.mark.parametrize("factory", [gpt2_causal_lm, llama_causal_lm],
                         ids=["gpt2", "llama"])
def test_causal_lm_copies_weight_for_weight(factory, rng):
    task = factory()
    copy = copy_model(task)
    assert [tuple(w.shape) for w in copy.weights] == [
        tuple(w.shape) for w in task.weights]
    copy.set_weights(task.get_weights())
    x = token_batch(rng, 3)
    np.testing.assert_allclose(copy.predict(x, verbose=0),
                               task.predict(x, verbose=0), atol=TOL)


def test_mirrored_engine_takes_a_causal_lm(rng):
    task = gpt2_causal_lm()
    parallel = multigpu.multi_gpu_model(task, gpus=2, engine="mirrored")
    assert parallel.engine == "mirrored"
    x = token_batch(rng, 6)
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               task.predict(x, verbose=0), atol=TOL)


# Full tier: the gate copies session Lambdas in the CPU relocation test below.
@pytest.mark.full
def test_session_lambda_trains_on_the_mirrored_engine(rng):
    template = _with_session_lambda()
    reference = _with_session_lambda()
    reference.set_weights(template.get_weights())
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine="mirrored")
    x = rng.standard_normal((10, 4)).astype("float32")
    y = rng.standard_normal((10, 2)).astype("float32")
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               reference.predict(x, verbose=0), atol=TOL)
    for model in (parallel, reference):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.fit(x, y, batch_size=10, epochs=1, shuffle=False, verbose=0)
    assert max_weight_difference(template, reference) < TOL


def test_a_saved_lambda_still_loads_only_as_keras_allows(tmp_path):
    template = _with_session_lambda()
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine="mirrored")
    path = str(tmp_path / "with_lambda.keras")
    parallel.save(path)
    with pytest.raises(ValueError, match="Lambda"):
        keras.models.load_model(path)


def test_cpu_relocation_keeps_lambdas_and_task_classes(rng):
    template = _with_session_lambda()
    parallel = multigpu.multi_gpu_model(template, gpus=2, cpu_relocation=True)
    x = rng.standard_normal((6, 4)).astype("float32")
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOL)
    task = gpt2_causal_lm()
    relocated = multigpu.multi_gpu_model(task, gpus=2, cpu_relocation=True)
    assert type(relocated.template) is type(task)
    assert max_weight_difference(relocated.template, task) == 0


# Full tier: the gate's published-model zoo copies KerasHub backbones.
@pytest.mark.full
def test_a_keras_hub_backbone_inside_a_functional_model(rng):
    backbone = bert_text_classifier().backbone
    inputs = {name: keras.Input((8,), dtype="int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask")}
    pooled = backbone(inputs)["pooled_output"]
    template = keras.Model(inputs, keras.layers.Dense(2, name="head")(pooled))
    copy = copy_model(template)
    assert type(copy.get_layer(backbone.name)) is type(backbone)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine="mirrored")
    x = token_batch(rng, 6, segments=True)
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOL)


# Adapted preprocessing: state outside the config (Normalization's
# finalised mean and variance, a lookup's table) reaches the copy.

def _normalized(rng):
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(rng.normal(5.0, 3.0, (64, 4)).astype("float32"))
    inputs = keras.Input((4,), name="features")
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(norm(inputs)),
                       name="normalized")


def _discretized(rng):
    bins = keras.layers.Discretization(num_bins=4, name="bins")
    bins.adapt(rng.normal(0.0, 3.0, (64, 4)).astype("float32"))
    inputs = keras.Input((4,), name="features")
    hot = keras.layers.CategoryEncoding(4, output_mode="one_hot")(
        bins(inputs)[:, 0])
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(hot),
                       name="discretized")


def _looked_up(layer, inputs, data):
    layer.adapt(data)
    embedded = keras.layers.Embedding(32, 3, name="embed")(layer(inputs))
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(
        keras.layers.Flatten()(embedded)), name=f"with_{layer.name}")


def _integer_lookup(rng):
    return _looked_up(keras.layers.IntegerLookup(name="ids"),
                      keras.Input((3,), dtype="int64", name="ids_in"),
                      rng.integers(100, 120, (64, 3)))


def _string_lookup(rng):
    words = np.array(["red", "green", "blue", "cyan", "grey"])
    return _looked_up(keras.layers.StringLookup(name="words"),
                      keras.Input((3,), dtype="string", name="words_in"),
                      words[rng.integers(0, 5, (64, 3))])


def _text_vectorization(rng):
    words = np.array(["the", "cat", "sat", "on", "a", "mat", "dog"])
    text = np.array([" ".join(words[rng.integers(0, 7, 5)])
                     for _ in range(32)])
    layer = keras.layers.TextVectorization(max_tokens=20,
                                           output_sequence_length=4,
                                           name="text")
    return _looked_up(layer, keras.Input((), dtype="string", name="text_in"),
                      text)


def _nested(rng):
    inner = _normalized(rng)
    inputs = keras.Input((4,), name="outer_in")
    return keras.Model(inputs, keras.layers.Dense(1, name="top")(inner(inputs)),
                       name="outer")


def _probe_rows(model, rng):
    """Rows the model was adapted to (numbers, ids and words it knows)."""
    spec = model.inputs[0]
    if spec.dtype == "string":
        words = np.array(["red", "green", "blue", "the cat sat", "a dog"],
                         dtype=object)
        return words[rng.integers(0, 5, (6,) + tuple(spec.shape[1:]))]
    if "int" in spec.dtype:
        return rng.integers(100, 120, (6,) + tuple(spec.shape[1:]))
    return rng.normal(5.0, 3.0, (6,) + tuple(spec.shape[1:])).astype("float32")


PREPROCESSED = [_normalized, _discretized, _integer_lookup, _string_lookup,
                _text_vectorization, _nested]


@pytest.mark.parametrize("factory", PREPROCESSED,
                         ids=lambda f: f.__name__.strip("_"))
def test_adapted_preprocessing_reaches_the_copy(factory, rng):
    template = factory(rng)
    x = _probe_rows(template, rng)
    expected = np.asarray(template(x, training=False))
    copy = copy_model(template)
    np.testing.assert_allclose(np.asarray(copy(x, training=False)), expected,
                               atol=TOL)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine="mirrored")
    # Keras's predict takes strings as a tensor, not a NumPy object array.
    batch = tf.constant(x.astype(str)) if x.dtype == object else x
    np.testing.assert_allclose(parallel.predict(batch, verbose=0), expected,
                               atol=TOL)


# Full tier: adapted preprocessing reaches the copy in the gate's tests above.
@pytest.mark.full
def test_normalization_trains_like_the_template_on_the_mirrored_engine(rng):
    template = _normalized(rng)
    reference = _normalized(rng)
    reference.set_weights(template.get_weights())
    reference.get_layer("norm").finalize_state()
    x = rng.normal(5.0, 3.0, (12, 4)).astype("float32")
    y = rng.normal(size=(12, 2)).astype("float32")
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine="mirrored")
    for model in (parallel, reference):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    assert max_weight_difference(template, reference) < 1e-5


# State no hand-over carries: an attribute set after construction.

class Scale(keras.layers.Layer):
    """Multiplies by `scale`, an attribute its config does not hold."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scale = 1.0

    def call(self, inputs):
        return inputs * self.scale


def _scaled(name="scaled_model"):
    inputs = keras.Input((4,), name="features")
    scale = Scale(name="scaled")
    hidden = keras.layers.Dense(3, name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(
        scale(hidden)), name=name)
    scale.scale = 3.0
    return model


def _nested_scaled():
    inputs = keras.Input((4,), name="outer_in")
    outputs = keras.layers.Dense(1, name="top")(_scaled("inner")(inputs))
    return keras.Model(inputs, outputs, name="outer")


@pytest.mark.parametrize("factory", [_scaled, _nested_scaled],
                         ids=["flat", "nested"])
def test_a_copy_that_computes_otherwise_is_refused_naming_the_layer(factory):
    template = factory()
    with pytest.raises(ValueError, match=(
            r"Invalid `model` for engine='mirrored': the copy of '\w+' gives "
            r"other outputs .*layer 'scaled' \(Scale\) computes otherwise.*"
            r"Use engine='replicate'")) as caught:
        multigpu.multi_gpu_model(template, gpus=2, engine="mirrored")
    assert isinstance(caught.value, CopyMismatch)
    assert caught.value.difference.difference > 0.1
    with pytest.raises(ValueError, match=(
            r"Invalid `model` for cpu_relocation=True: .*layer 'scaled'.*"
            r"keep cpu_relocation=False")):
        multigpu.multi_gpu_model(template, gpus=2, cpu_relocation=True)


def test_auto_falls_back_to_the_replicate_engine_saying_why(
        monkeypatch, rng):
    # Judged as GPUs, 4 devices make "auto" predict the mirrored engine.
    choose = choice_lib.choose_engine
    monkeypatch.setattr(choice_lib, "choose_engine", lambda devices: choose(
        [f"/device:GPU:{i}" for i in range(len(devices))]))
    template = _scaled()
    with pytest.warns(UserWarning, match=r"layer 'scaled' \(Scale\)"):
        parallel = multigpu.multi_gpu_model(template, gpus=4)
    assert parallel.engine == "replicate"
    assert "fell back: the mirrored engine cannot take the model" in (
        parallel.engine_reason)
    assert "layer 'scaled'" in parallel.engine_reason
    x = rng.standard_normal((8, 4)).astype("float32")
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOL)
    # An adapted Normalization is carried: auto keeps the mirrored engine.
    assert multigpu.multi_gpu_model(_normalized(rng), gpus=4).engine == (
        "mirrored")


def test_a_copy_failing_on_the_probe_is_named():
    # A lookup whose table the copy lacks fails where the model runs.
    template = _integer_lookup(np.random.default_rng(1))
    copy = copy_model(template)
    copy.get_layer("ids").lookup_table = (
        copy.get_layer("ids")._uninitialized_lookup_table())
    difference = copy_difference(template, copy)
    assert difference.layer == "layer 'ids' (IntegerLookup)"
    assert difference.difference == np.inf
    assert "not initialized" in difference.error


@pytest.mark.parametrize("factory", [gpt2_causal_lm, bert_text_classifier],
                         ids=["gpt2", "bert"])
def test_the_probe_runs_a_keras_hub_task(factory):
    # Token ids of ones and zeros fit any vocabulary; the check is real.
    task = factory()
    probe = probe_batch(task)
    assert all(np.asarray(v).dtype.kind == "i" for v in probe.values())
    task(probe, training=False)
    assert copy_difference(task, task) is None


def _squared_error(y_true, y_pred):
    """A loss function of this session that Keras cannot look up by name."""
    return ops.square(y_true - y_pred)


def test_a_model_compiled_with_a_session_loss_is_copied(rng):
    # clone_model alone would compile the copy from the compile config.
    template = _with_session_lambda()
    template.compile(optimizer="sgd", loss=_squared_error)
    copy = copy_model(template)
    assert not copy.compiled and template.compiled
    x = rng.standard_normal((4, 4)).astype("float32")
    np.testing.assert_allclose(np.asarray(copy(x)), np.asarray(template(x)),
                               atol=TOL)


class _NoConfig(keras.Model):
    """A subclassed model without `get_config`: it cannot be copied."""

    def __init__(self):
        super().__init__(name="no_config")
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


def test_copy_in_scope_makes_the_strategys_checked_copy(rng):
    # The one copy the mirrored engine and check_equivalence's "strategy"
    # run train.
    strategy = strategy_over(multigpu.resolve_devices(2))
    template = _with_session_lambda()
    copy = copy_in_scope(template, strategy, "Invalid `model` for test",
                         "Do otherwise.")
    assert all(strategy.extended.variable_created_in_scope(v.value)
               for v in copy.weights)
    assert not any(strategy.extended.variable_created_in_scope(v.value)
                   for v in template.weights)
    x = rng.standard_normal((4, 4)).astype("float32")
    np.testing.assert_allclose(np.asarray(copy(x)), np.asarray(template(x)),
                               atol=TOL)
    with pytest.raises(CopyMismatch, match=(
            r"(?s)^Invalid `model` for test: .*layer 'scaled' \(Scale\) .*"
            r"Do otherwise\.$")):
        copy_in_scope(_scaled(), strategy, "Invalid `model` for test",
                      "Do otherwise.", uncopyable_fix="Not this one.")
    uncopyable = _NoConfig()
    uncopyable(x)
    with pytest.raises(ValueError, match=(
            r"(?s)^Invalid `model` for test: 'no_config' cannot be cloned "
            r"\(.*\)\. Not this one\.$")):
        copy_in_scope(uncopyable, strategy, "Invalid `model` for test",
                      "Do otherwise.", uncopyable_fix="Not this one.")
