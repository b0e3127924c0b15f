"""A differential zoo: every model shape, every engine, the template's numbers.

For each model of `models.ZOO` and each engine (`multi_gpu_model`'s
replicate and mirrored engines, `model_parallel` with 1 and 2
micro-batches) on 2, 3 and 4 devices: predictions equal the template's, one
SGD step and then one Adam step leave the template's weights, and the saved
file loads with stock `keras.models.load_model` (compiled, for `.h5`) and
predicts the same. `hypothesis` searches the batch sizes (0 to 3x the
devices plus one) and `model_parallel`'s split points.

Both are zoos (`support/tiers.py`): the gate runs each model on one engine
and device count, in turn along the product, so that every engine and every
count is met; the full tier runs the whole product. MobileNet's training
(65 s a case) runs only with `pytest -m slow`.
"""

import itertools

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import multigpu
from support.models import ZOO, copy_of, max_weight_difference, zoo_batch

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")

ENGINES = ("replicate", "mirrored", "model_parallel_1", "model_parallel_2")
DEVICE_COUNTS = (2, 3, 4)
TOL = 1e-5
# float16 matmuls summed over sub-batches in another order.
TOLERANCES = {"mixed_float16": 2e-3}
# 65 s a case: `pytest -m slow`; the gate and the full tier check its
# predictions.
SLOW_TRAINING = {"application"}
EXAMPLES = settings(max_examples=5, deadline=None, derandomize=True,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _cases():
    cases = []
    for name, engine, devices in itertools.product(ZOO, ENGINES,
                                                   DEVICE_COUNTS):
        cases.append(pytest.param(
            name, engine, devices, id=f"{name}-{engine}-{devices}",
            marks=(pytest.mark.slow,) if name in SLOW_TRAINING else ()))
    return cases


def _staged_layer_count(model):
    return len([layer for layer in model.layers
                if not isinstance(layer, keras.layers.InputLayer)])


def _unsupported(name, engine, devices, model):
    """The error a case must raise, or None when it must work."""
    if not engine.startswith("model_parallel"):
        return None
    if name == "subclassed":
        return "no symbolic inputs: it is a subclassed model"
    if devices > _staged_layer_count(model):
        return f"Use at most {_staged_layer_count(model)} devices"
    return None


def _parallelize(model, engine, devices, **kwargs):
    if engine.startswith("model_parallel"):
        microbatches = int(engine.rsplit("_", 1)[1])
        return multigpu.model_parallel(model, devices=devices,
                                       microbatches=microbatches, **kwargs)
    return multigpu.multi_gpu_model(model, gpus=devices, engine=engine)


def _deterministic(model):
    """Dropout and batch statistics off, so one step has one right answer.

    Dropout draws its masks per replica and BatchNormalization in training
    normalises each sub-batch by its own statistics (documented semantics);
    a frozen BatchNormalization runs in inference mode (Keras 3).
    """
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
    return model


def _close(got, want, tol):
    for g, w in zip(keras.tree.flatten(got), keras.tree.flatten(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=tol,
                                   rtol=tol)


@pytest.mark.zoo(axes=("engine", "devices"))
@pytest.mark.parametrize("name, engine, devices", _cases())
def test_engine_equals_the_template(name, engine, devices, rng, tmp_path):
    template = _deterministic(ZOO[name]())
    tol = TOLERANCES.get(name, TOL)
    unsupported = _unsupported(name, engine, devices, template)
    if unsupported:
        with pytest.raises(ValueError, match=unsupported):
            _parallelize(template, engine, devices)
        return
    reference = copy_of(template)
    parallel = _parallelize(template, engine, devices)
    x, y = zoo_batch(template, rng, 2 * devices + 1)

    _close(parallel.predict_on_batch(x), reference.predict_on_batch(x), tol)
    for optimizer in (lambda: keras.optimizers.SGD(0.1),
                      lambda: keras.optimizers.Adam(0.01)):
        parallel.compile(optimizer=optimizer(), loss="mse")
        reference.compile(optimizer=optimizer(), loss="mse")
        parallel.train_on_batch(x, y)
        reference.train_on_batch(x, y)
        assert max_weight_difference(parallel.template, reference) < tol

    path = tmp_path / ("model.keras" if name == "subclassed" else "model.h5")
    parallel.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.optimizer is not None
    assert int(loaded.optimizer.iterations) == 1
    _close(loaded.predict_on_batch(x), reference.predict_on_batch(x), tol)


_PREDICTORS = {}


def _predictor(name, engine, devices):
    """A parallel model and its template, built once per parameter."""
    key = (name, engine, devices)
    if key not in _PREDICTORS:
        template = ZOO[name]()
        _PREDICTORS[key] = (_parallelize(template, engine, devices),
                            copy_of(template))
    return _PREDICTORS[key]


def _prediction_cases():
    # Every (model, engine) pair, on the device counts in turn: a zoo, which
    # the gate samples down to one pair per model.
    cases = []
    for i, (name, engine) in enumerate(itertools.product(ZOO, ENGINES)):
        devices = DEVICE_COUNTS[i % len(DEVICE_COUNTS)]
        if engine.startswith("model_parallel") and _unsupported(
                name, engine, devices, ZOO[name]()):
            continue
        cases.append(pytest.param(name, engine, devices,
                                  id=f"{name}-{engine}-{devices}"))
    return cases


@pytest.mark.zoo(axes=("engine", "devices"))
@pytest.mark.parametrize("name, engine, devices", _prediction_cases())
@EXAMPLES
@given(data=st.data())
def test_predictions_equal_for_any_batch_size(name, engine, devices, data):
    parallel, template = _predictor(name, engine, devices)
    rows = data.draw(st.integers(0, 3 * devices + 1), label="rows")
    x, _ = zoo_batch(template, np.random.default_rng(rows), rows)
    got = parallel.predict_on_batch(x)
    for g, t in zip(keras.tree.flatten(got),
                    keras.tree.flatten(template.compute_output_spec(
                        keras.tree.map_structure(
                            lambda a: keras.KerasTensor(a.shape, a.dtype),
                            x)))):
        assert np.asarray(g).shape == (rows,) + tuple(t.shape[1:])
    if rows:
        _close(got, template.predict_on_batch(x),
               TOLERANCES.get(name, TOL))


@pytest.mark.parametrize("name", [
    "branching", "residual",
    pytest.param("multi_output", marks=pytest.mark.slow),
    pytest.param("rnn_state", marks=pytest.mark.slow),
    pytest.param("multi_input", marks=pytest.mark.slow),
])
@EXAMPLES
@given(data=st.data())
def test_any_split_trains_like_the_template(name, data):
    template = ZOO[name]()
    layers = [layer.name for layer in template.layers
              if not isinstance(layer, keras.layers.InputLayer)]
    devices = data.draw(st.integers(2, min(4, len(layers))), label="devices")
    starts = data.draw(st.lists(st.integers(1, len(layers) - 1),
                                min_size=devices - 1, max_size=devices - 1,
                                unique=True).map(sorted), label="starts")
    microbatches = data.draw(st.integers(1, 3), label="microbatches")
    split = [layers[i] for i in starts]
    try:
        parallel = multigpu.model_parallel(template, devices=devices,
                                           split=split,
                                           microbatches=microbatches)
    except ValueError as error:
        assert "cannot be cut there" in str(error)
        assume(False)
    reference = copy_of(template)
    x, y = zoo_batch(template, np.random.default_rng(devices), 7)
    parallel.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    parallel.train_on_batch(x, y)
    reference.train_on_batch(x, y)
    assert max_weight_difference(parallel.template, reference) < TOL
