"""The mirrored engine's copy of a model: KerasHub tasks, session Lambdas.

`multigpu.copies.copy_model` makes the copy the mirrored engine trains. A
KerasHub causal LM (its token embedding is also its output projection)
copies weight for weight; a `Lambda` layer written in this session is
trusted code and runs in the copy whatever globals it reads, while a saved
file holding one still loads only as Keras allows (`safe_mode`).
"""

import keras
import numpy as np
import pytest
from keras import ops

import multigpu
from hub_models import (
    bert_text_classifier,
    gpt2_causal_lm,
    llama_causal_lm,
    token_batch,
)
from models import max_weight_difference
from multigpu.copies import copy_model

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
    parallel = multigpu.multi_gpu_model(task, gpus=4, engine="mirrored")
    assert parallel.engine == "mirrored"
    x = token_batch(rng, 6)
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               task.predict(x, verbose=0), atol=TOL)


def test_session_lambda_trains_on_the_mirrored_engine(rng):
    template = _with_session_lambda()
    reference = _with_session_lambda()
    reference.set_weights(template.get_weights())
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine="mirrored")
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
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine="mirrored")
    path = str(tmp_path / "with_lambda.keras")
    parallel.save(path)
    with pytest.raises(ValueError, match="Lambda"):
        keras.models.load_model(path)


def test_cpu_relocation_keeps_lambdas_and_task_classes(rng):
    template = _with_session_lambda()
    parallel = multigpu.multi_gpu_model(template, gpus=4, cpu_relocation=True)
    x = rng.standard_normal((6, 4)).astype("float32")
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOL)
    task = gpt2_causal_lm()
    relocated = multigpu.multi_gpu_model(task, gpus=4, cpu_relocation=True)
    assert type(relocated.template) is type(task)
    assert max_weight_difference(relocated.template, task) == 0


def test_a_keras_hub_backbone_inside_a_functional_model(rng):
    backbone = bert_text_classifier().backbone
    inputs = {name: keras.Input((8,), dtype="int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask")}
    pooled = backbone(inputs)["pooled_output"]
    template = keras.Model(inputs, keras.layers.Dense(2, name="head")(pooled))
    copy = copy_model(template)
    assert type(copy.get_layer(backbone.name)) is type(backbone)
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine="mirrored")
    x = token_batch(rng, 6, segments=True)
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOL)
