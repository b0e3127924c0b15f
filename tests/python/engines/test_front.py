"""multi_gpu_model(engine=...): which engine runs, and both engines side by side.

The mirrored engine's own contract is tested in test_mirrored.py.
"""

import inspect
import warnings

import keras
import numpy as np
import pytest

import multigpu
from multigpu.engines import choice as choice_lib
from multigpu.engines import front as engines
from multigpu.engines.tensorflow import mirrored
from support.models import (
    copy_of,
    data,
    max_weight_difference,
    mlp,
    model_with_r_layer,
)

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = pytest.mark.zoo(axes=("engine",), scope="module")


def test_default_engine_is_auto():
    default = inspect.signature(multigpu.multi_gpu_model).parameters["engine"]
    assert default.default == engines.DEFAULT_ENGINE == "auto"


def _built_with_engine_warnings(**kwargs):
    """`multi_gpu_model(mlp(), **kwargs)` and its warnings about the engine."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel = multigpu.multi_gpu_model(mlp(), **kwargs)
    return parallel, [str(w.message) for w in caught
                      if "engine=" in str(w.message)]


def test_auto_runs_the_replicate_engine_on_logical_cpu_devices():
    parallel, engine_warnings = _built_with_engine_warnings(gpus=2)
    assert not engine_warnings
    assert isinstance(parallel, multigpu.ParallelModel)
    assert parallel.engine == "replicate"
    assert "logical CPU devices" in parallel.engine_reason


def test_explicit_engines_run_as_requested():
    for engine, kind in (("replicate", multigpu.ParallelModel),
                         ("mirrored", mirrored.MirroredModel)):
        parallel = multigpu.multi_gpu_model(mlp(), gpus=2, engine=engine)
        assert isinstance(parallel, kind) and parallel.engine == engine
        assert parallel.engine_reason == f"requested with engine='{engine}'"


@pytest.fixture
def devices_read_as_gpus(monkeypatch):
    """`choose_engine` judging the logical devices as if they were GPUs."""
    choose = choice_lib.choose_engine
    monkeypatch.setattr(choice_lib, "choose_engine", lambda devices: choose(
        [f"/device:GPU:{i}" for i in range(len(devices))]))


@pytest.mark.usefixtures("devices_read_as_gpus")
def test_auto_runs_the_predicted_winner():
    parallel, engine_warnings = _built_with_engine_warnings(gpus=4)
    assert not engine_warnings
    assert isinstance(parallel, mirrored.MirroredModel)
    assert "on 4 GPUs" in parallel.engine_reason


@pytest.mark.usefixtures("devices_read_as_gpus")
def test_auto_falls_back_once_naming_cpu_merge():
    parallel, messages = _built_with_engine_warnings(gpus=4, cpu_merge=False)
    assert len(messages) == 1
    assert "would pick the mirrored engine" in messages[0]
    assert "but cpu_merge=False places the merge" in messages[0]
    assert isinstance(parallel, multigpu.ParallelModel)
    assert parallel.merge_device == parallel.devices[0]
    assert "fell back: cpu_merge=False" in parallel.engine_reason


class Scaled(keras.Model):
    """A subclassed model without `get_config`: it cannot be cloned."""

    def __init__(self, units):
        super().__init__()
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return self.dense(x) * 2.0


@pytest.mark.usefixtures("devices_read_as_gpus")
def test_auto_falls_back_on_a_model_the_mirrored_engine_cannot_copy(rng):
    template = Scaled(3)
    x, _ = data(rng, 8)
    template(x[:1])
    with pytest.warns(UserWarning, match=r"cannot take the model \(Invalid "
                                         r"`model` for engine='mirrored'"):
        parallel = multigpu.multi_gpu_model(template, gpus=4)
    assert parallel.engine == "replicate"
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), rtol=1e-6)
    with pytest.raises(ValueError, match=r"cannot be cloned"):
        multigpu.multi_gpu_model(template, gpus=4, engine="mirrored")


def test_invalid_engine_and_flags_are_named():
    with pytest.raises(ValueError, match=r"`engine`: received 'nccl'"):
        multigpu.multi_gpu_model(mlp(), gpus=2, engine="nccl")
    with pytest.raises(ValueError, match=r"`cpu_merge`: received False"):
        multigpu.multi_gpu_model(mlp(), gpus=2, engine="mirrored",
                                 cpu_merge=False)


def test_both_engines_and_two_device_sets_train_in_one_process(rng):
    x, y = data(rng, 40)
    for gpus, engine in ((2, "mirrored"), (4, "replicate"), (3, "mirrored")):
        template = mlp()
        reference = copy_of(template)
        parallel = multigpu.multi_gpu_model(template, gpus=gpus, engine=engine)
        for model in (parallel, reference):
            model.compile(optimizer="sgd", loss="mse")
        got = parallel.fit(x, y, batch_size=10, shuffle=False, verbose=0)
        want = reference.fit(x, y, batch_size=10, shuffle=False, verbose=0)
        np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                                   rtol=1e-5, err_msg=f"{engine} on {gpus}")
        assert max_weight_difference(template, reference) < 1e-5, (engine,
                                                                   gpus)


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_training_with_validation_data_equals_the_template(rng, engine):
    # fit validates through evaluate(): the replicas' weights of the epoch
    # being trained must be the ones evaluated and trained on afterwards.
    template = mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    for model in (parallel, reference):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = data(rng, 32)
    x_val, y_val = data(rng, 12)
    arguments = dict(batch_size=8, epochs=3, shuffle=False, verbose=0,
                     validation_data=(x_val, y_val))
    got = parallel.fit(x, y, **arguments).history
    want = reference.fit(x, y, **arguments).history
    assert max_weight_difference(template, reference) < 1e-5
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["val_loss"], want["val_loss"], rtol=1e-5)


def test_a_layer_written_in_r_keeps_the_replicate_engine():
    # The mirrored engine traces replicas in threads, where R cannot run.
    model = model_with_r_layer()
    with pytest.raises(ValueError, match=r"'penalty' \(RowPenalty\) runs R "
                       r"code[\s\S]*engine='replicate'"):
        multigpu.multi_gpu_model(model, gpus=4, engine="mirrored")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert multigpu.multi_gpu_model(model, gpus=4).engine == "replicate"
