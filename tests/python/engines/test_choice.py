"""`choice.decide_engine`: every path of `multi_gpu_model`'s engine decision.

The decision only: which engine is faster on real GPUs only a GPU run can
confirm (docs/benchmarks.md gives the prediction and its basis). That
`multi_gpu_model` builds what the decision says is tested in test_front.py,
test_copies.py and test_sync_batchnorm.py.
"""

import keras
import numpy as np
import pytest

from multigpu.engines import choice as choice_lib
from multigpu.engines.copies import CopyMismatch
from multigpu.engines.tensorflow import sync_batchnorm

GPUS = [f"/device:GPU:{i}" for i in range(8)]
CPUS = [f"/device:CPU:{i}" for i in range(8)]
decide = choice_lib.decide_engine


class _HiddenNorm(keras.Model):
    """BatchNormalization inside code: the replicate engine cannot walk it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.norm = keras.layers.BatchNormalization()
        self.out = keras.layers.Dense(1)

    def call(self, x, training=None):
        return self.out(self.norm(x, training=training))


@pytest.fixture(scope="module")
def walk_problem():
    """Why the replicate engine cannot pool a subclassed model's statistics."""
    model = _HiddenNorm(name="hidden_norm")
    model(np.zeros((1, 4), "float32"))
    problem = sync_batchnorm.walk_problem(model)
    assert problem and "'hidden_norm'" in problem
    return problem


def test_choose_engine_follows_the_byte_counts():
    assert choice_lib.choose_engine(GPUS).engine == "mirrored"
    assert "7 copies" in choice_lib.choose_engine(GPUS).reason
    assert choice_lib.choose_engine(GPUS[:4]).engine == "mirrored"
    assert choice_lib.choose_engine(GPUS[:2]).engine == "replicate"
    assert choice_lib.choose_engine(CPUS[:4]).engine == "replicate"


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
@pytest.mark.parametrize("devices", [CPUS[:2], GPUS[:2], GPUS],
                         ids=["2 cpus", "2 gpus", "8 gpus"])
def test_a_requested_engine_runs_as_requested(engine, devices):
    choice = decide(engine, devices)
    assert choice == (engine, f"requested with engine='{engine}'", None, None)
    assert choice.engine_reason == f"requested with engine='{engine}'"


def test_the_replicate_engine_takes_cpu_merge_false_without_a_word():
    choice = decide("replicate", GPUS, cpu_merge=False)
    assert (choice.engine, choice.fallback, choice.warning) == (
        "replicate", None, None)


@pytest.mark.parametrize("n, engine", [(2, "replicate"), (3, "mirrored"),
                                       (4, "mirrored"), (8, "mirrored")])
def test_auto_on_gpus_runs_the_predicted_winner(n, engine):
    choice = decide("auto", GPUS[:n])
    assert choice == choice_lib.choose_engine(GPUS[:n])
    assert (choice.engine, choice.fallback, choice.warning) == (
        engine, None, None)
    assert f"on {n} GPUs" in choice.reason or n == 2


def test_auto_on_logical_cpu_devices_runs_the_replicate_engine():
    choice = decide("auto", CPUS)
    assert (choice.engine, choice.fallback, choice.warning) == (
        "replicate", None, None)
    assert "logical CPU devices" in choice.reason


def test_auto_falls_back_when_cpu_merge_is_false():
    choice = decide("auto", GPUS[:4], cpu_merge=False)
    assert choice.engine == "replicate"
    assert choice.reason == choice_lib.choose_engine(GPUS[:4]).reason
    assert choice.fallback.startswith("cpu_merge=False places the merge")
    assert choice.warning == (
        f"engine='auto' would pick the mirrored engine ({choice.reason}), "
        f"but {choice.fallback}: using engine='replicate'. Pass "
        "engine='replicate' to choose it and silence this warning.")
    assert choice.engine_reason == (
        f"{choice.reason}; fell back: {choice.fallback}")
    # On 2 GPUs auto picks the replicate engine anyway: nothing to fall from.
    assert decide("auto", GPUS[:2], cpu_merge=False).fallback is None


def test_auto_runs_the_mirrored_engine_for_a_model_it_cannot_walk(
        walk_problem):
    for devices, cpu_merge in ((CPUS[:4], True), (GPUS[:2], True),
                               (GPUS[:4], False)):
        choice = decide("auto", devices, cpu_merge, walk_problem=walk_problem)
        assert choice.engine == "mirrored" and choice.fallback is None
        assert choice.reason == (
            f"sync_batchnorm=True and {walk_problem}: only the mirrored "
            "engine pools its BatchNormalization statistics")
        assert choice.warning == (
            f"engine='auto' runs the mirrored engine: {choice.reason}. Pass "
            "engine='mirrored' to choose it and silence this warning.")
    # The predicted winner pools them already: nothing to say.
    choice = decide("auto", GPUS[:4], walk_problem=walk_problem)
    assert choice == choice_lib.choose_engine(GPUS[:4])


def test_a_requested_engine_with_a_model_it_cannot_walk(walk_problem):
    choice = decide("mirrored", CPUS[:4], walk_problem=walk_problem)
    assert choice == ("mirrored", "requested with engine='mirrored'",
                      None, None)
    with pytest.raises(ValueError, match=(
            r"^Invalid `model` for sync_batchnorm=True with "
            r"engine='replicate': 'hidden_norm' is a subclassed model.*"
            r"Use engine='mirrored' \(or engine='auto'\)")):
        decide("replicate", CPUS[:4], walk_problem=walk_problem)


def test_auto_falls_back_when_the_mirrored_engine_refuses_the_model():
    refusal = ValueError("Invalid `model` for engine='mirrored': 'm' cannot\n"
                         "  be cloned (no config).")
    choice = decide("auto", GPUS[:4], refusal=refusal)
    assert choice.engine == "replicate"
    assert choice.reason == choice_lib.choose_engine(GPUS[:4]).reason
    # The refusal's text on one line.
    assert choice.fallback == (
        "the mirrored engine cannot take the model (Invalid `model` for "
        "engine='mirrored': 'm' cannot be cloned (no config).)")
    assert choice.warning.startswith(
        "engine='auto' would pick the mirrored engine (on 4 GPUs")
    assert "using engine='replicate'" in choice.warning
    assert "fell back: the mirrored engine cannot take" in (
        choice.engine_reason)


def test_a_requested_mirrored_engine_raises_its_refusal_as_it_is():
    refusal = CopyMismatch("Invalid `model` for engine='mirrored': ...", None)
    with pytest.raises(CopyMismatch) as caught:
        decide("mirrored", CPUS[:4], refusal=refusal)
    assert caught.value is refusal


def test_a_refusal_of_a_model_neither_engine_can_pool(walk_problem):
    refusal = ValueError("Invalid `model` for engine='mirrored': no copy.")
    for engine in ("auto", "mirrored"):
        with pytest.raises(ValueError, match=(
                r"^Invalid `model` for engine='mirrored': no copy\. With "
                r"sync_batchnorm=True the replicate engine cannot take it "
                r"either: 'hidden_norm' is a subclassed model.*Leave "
                r"sync_batchnorm=False for this model\.$")):
            decide(engine, CPUS[:4], walk_problem=walk_problem,
                   refusal=refusal)


def test_a_refusal_leaves_a_replicate_choice_alone():
    refusal = ValueError("not asked")
    assert decide("auto", CPUS[:4], refusal=refusal) == decide("auto",
                                                               CPUS[:4])
    assert decide("replicate", GPUS, refusal=refusal) == decide("replicate",
                                                                GPUS)
