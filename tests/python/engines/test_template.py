"""A compiled template lends its compile configuration to the parallel model.

The parallel model of a compiled template needs no `compile()`: `fit`,
`evaluate` and the `*_on_batch` steps use the template's loss, metrics and
optimizer (`template.compile_like_template`). `compile()` with no
arguments takes the defaults of the template's own `compile` (a KerasHub
task's "auto" optimizer, loss and metrics; `template.compile_defaults`).
"""

import keras
import numpy as np
import pytest

import multigpu
from multigpu.engines.template import TemplateLayer, TemplateWrapper
from support.hub_models import gpt2_causal_lm, token_batch
from support.models import copy_of, data, max_weight_difference, mlp

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]

ENGINES = ("replicate", "mirrored")
# The compile configuration is no matter of the device count: 2 devices,
# half the replicas of 4 to trace.
DEVICES = 2
TOL = 1e-6


def _compiled(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                  metrics=["mae"])
    return model


@pytest.mark.parametrize("engine", ENGINES)
def test_fit_uses_the_compiled_templates_configuration(engine, rng):
    template = _compiled(mlp())
    reference = _compiled(copy_of(template))
    parallel = multigpu.multi_gpu_model(template, gpus=DEVICES, engine=engine)
    x, y = data(rng, 10)
    history = parallel.fit(x, y, batch_size=10, epochs=1, shuffle=False,
                           verbose=0)
    reference.fit(x, y, batch_size=10, epochs=1, shuffle=False, verbose=0)
    assert set(history.history) == {"loss", "mae"}
    assert isinstance(parallel.optimizer, keras.optimizers.SGD)
    assert max_weight_difference(template, reference) < TOL
    logs = parallel.evaluate(x, y, verbose=0, return_dict=True)
    expected = reference.evaluate(x, y, verbose=0, return_dict=True)
    np.testing.assert_allclose(logs["loss"], expected["loss"], rtol=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
def test_evaluate_and_train_on_batch_need_no_compile(engine, rng):
    template = _compiled(mlp())
    reference = _compiled(copy_of(template))
    x, y = data(rng, 6)
    parallel = multigpu.multi_gpu_model(template, gpus=DEVICES, engine=engine)
    assert set(parallel.evaluate(x, y, verbose=0, return_dict=True)) == {
        "loss", "mae"}
    other = multigpu.multi_gpu_model(_compiled(copy_of(template)), gpus=DEVICES,
                                     engine=engine)
    other.train_on_batch(x, y)
    reference.train_on_batch(x, y)
    assert max_weight_difference(other.template, reference) < TOL


@pytest.mark.parametrize("engine", ENGINES)
def test_a_parallel_compile_of_its_own_wins(engine, rng):
    template = _compiled(mlp())
    parallel = multigpu.multi_gpu_model(template, gpus=DEVICES, engine=engine)
    parallel.compile(optimizer="adam", loss="mae")
    x, y = data(rng, 4)
    history = parallel.fit(x, y, epochs=1, verbose=0)
    assert set(history.history) == {"loss"}
    assert isinstance(parallel.optimizer, keras.optimizers.Adam)


@pytest.mark.parametrize("engine", ENGINES)
def test_keras_hub_task_trains_without_compile(engine, rng):
    task = gpt2_causal_lm()
    reference = gpt2_causal_lm()
    parallel = multigpu.multi_gpu_model(task, gpus=DEVICES, engine=engine)
    x, y = token_batch(rng, 6), rng.integers(0, 50, (6, 8)).astype("int32")
    parallel.fit(x, y, batch_size=6, epochs=1, shuffle=False, verbose=0)
    reference.fit(x, y, batch_size=6, epochs=1, shuffle=False, verbose=0)
    assert max_weight_difference(task, reference) < TOL


@pytest.mark.parametrize("engine", ENGINES)
def test_bare_compile_takes_the_tasks_defaults(engine, rng):
    task = gpt2_causal_lm()
    parallel = multigpu.multi_gpu_model(task, gpus=DEVICES, engine=engine)
    parallel.compile(optimizer="sgd", loss="mse")  # replaced by the defaults:
    parallel.compile()
    assert isinstance(parallel.optimizer, keras.optimizers.Adam)
    assert parallel.optimizer.get_config()["learning_rate"] == pytest.approx(2e-5)
    assert parallel.loss.get_config()["from_logits"] is True
    x, y = token_batch(rng, 5), rng.integers(0, 50, (5, 8)).astype("int32")
    logs = parallel.evaluate(x, y, verbose=0, return_dict=True)
    assert set(logs) == {"loss", "sparse_categorical_accuracy"}


def test_bare_compile_of_a_plain_template_is_keras_own():
    parallel = multigpu.multi_gpu_model(mlp(), gpus=DEVICES)
    parallel.compile()
    assert isinstance(parallel.optimizer, keras.optimizers.RMSprop)
    assert parallel.loss is None


def _wrappers():
    """A model of each `TemplateWrapper` kind, over 2 devices."""
    return {
        "ParallelModel": multigpu.multi_gpu_model(mlp(), gpus=2,
                                                  engine="replicate"),
        "PartitionedModel": multigpu.model_parallel(mlp(), devices=2),
    }


def test_both_wrappers_share_one_base():
    for name, wrapper in _wrappers().items():
        assert isinstance(wrapper, TemplateWrapper) and type(wrapper).__name__ == name
        layer = wrapper.template_layer
        assert isinstance(layer, TemplateLayer) and layer.template is wrapper.template
        assert wrapper.devices == layer.devices == multigpu.resolve_devices(2)
        assert wrapper.name == f"mlp_{type(wrapper).name_suffix}"
        assert keras.saving.get_registered_name(type(wrapper)) == (
            f"multigpu>{name}")
    parallel, partitioned = _wrappers().values()
    assert parallel.replicas_layer is parallel.template_layer
    assert partitioned.stages_layer is partitioned.template_layer


def test_a_wrapper_inside_a_saved_model_loads_by_its_registered_name(
        rng, tmp_path):
    x, _ = data(rng, 6)
    for name, wrapper in _wrappers().items():
        inputs = keras.Input((8,), name="features")
        outer = keras.Model(inputs, wrapper(inputs), name="outer")
        path = tmp_path / f"{name}.keras"
        keras.saving.save_model(outer, path)
        loaded = keras.models.load_model(path)
        inner = loaded.layers[-1]
        assert type(inner) is type(wrapper) and inner.devices == wrapper.devices
        np.testing.assert_allclose(loaded.predict(x, verbose=0),
                                   outer.predict(x, verbose=0), atol=TOL)
