"""The shared scenarios that apply on JAX, run on both backends and compared.

Every scenario whose `backends` name JAX (tests/scenarios/README.md) runs
here in the full tier, and in the gate every invalid-input one and one of
each pair of a recipe's valid ones, in turn (`scenario_pairs`), on the JAX
backend, with the Python runner
(`support.scenario_runner.PythonRun`): its steps run and its expectations
hold, as they read on JAX (`scenario_runner.on_backend`). One process on
TensorFlow, started once for the module, runs the scenarios this session
runs with the
same runner meanwhile (`support.scenario_backends.TensorFlowRuns`), and
each JAX record must equal the TensorFlow one: initial weights,
predictions, losses, metrics and final weights within 1e-5, and an invalid
input's error, class and message (and its R rendering), the same.

The TensorFlow run parallelizes a model with BatchNormalization layers with
`sync_batchnorm=True`: XLA's split reduces the moments over every device's
rows, the JAX engine's only choice (docs/backends.md); with the TensorFlow
default (False) each replica would normalize its own share of the batch,
and no exact comparison would hold.

Needs a pytest process started with `KERAS_BACKEND=jax`
(`make test-python-jax`); in any other process it is skipped, saying so.
"""

import pytest

from support.scenario_backends import (
    BACKEND_TOLERANCE,
    TensorFlowRuns,
    compare_backends,
    jax_scenarios,
)
from support.scenario_files import error_step, scenario_pairs
from support.scenario_runner import PythonRun

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SCENARIOS = jax_scenarios()
SCENARIO_OF_PAIR = dict(zip(scenario_pairs(SCENARIOS), SCENARIOS))
TEST = "test_a_scenario_on_jax_equals_its_tensorflow_run"


@pytest.fixture(scope="module")
def tensorflow_runs(request, tmp_path_factory):
    # The scenarios of the items this session kept (the gate's sample, or
    # the ones named), in their order.
    names = [SCENARIO_OF_PAIR[item.callspec.params["pair"],
                              item.callspec.params["member"]]["name"]
             for item in request.session.items if item.originalname == TEST]
    runs = TensorFlowRuns(names, tmp_path_factory.mktemp("tensorflow"))
    yield runs
    runs.close()


def test_the_scenarios_on_jax_cover_each_kind():
    valid = [s for s in SCENARIOS if error_step(s) is None]
    assert len(valid) >= 10 and len(SCENARIOS) - len(valid) >= 10
    assert {"mlp", "cnn", "two_io", "shared_submodel", "batchnorm", "rnn",
            "siamese_outputs"} <= {s["recipe"] for s in valid}


@pytest.mark.zoo(axes=("member",))
@pytest.mark.parametrize("pair, member", [
    pytest.param(*key, id=s["name"]) for key, s in SCENARIO_OF_PAIR.items()])
def test_a_scenario_on_jax_equals_its_tensorflow_run(pair, member,
                                                     tensorflow_runs, tmp_path):
    scenario = SCENARIO_OF_PAIR[pair, member]
    jax_record = PythonRun(scenario, tmp_path).execute()
    largest, compared = compare_backends(tensorflow_runs.record(scenario["name"]),
                                         jax_record)
    if error_step(scenario) is None:
        assert compared > 0
    assert largest <= BACKEND_TOLERANCE, (
        f"{scenario['name']}: JAX differs from TensorFlow by {largest:.3g}")
