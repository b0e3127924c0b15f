"""Parity through the keras3 R API: every shared scenario run in R as a keras3
user writes it (keras3 and tfdatasets attached, keras3's compile/fit/
evaluate/predict methods, optimizers, losses and metrics from keras3's
constructors; see `tests/testthat/helper-scenarios-keras3.R`), embedded in
this process, gives the numbers and the errors of its Python run
(`compare_records` of `scenario_parity.py`, within `PARITY_TOLERANCE`).
The full tier compares every scenario; the gate every invalid-input one and
one of each pair of a recipe's valid ones (`scenario_pairs`), and testthat's
`test-scenarios.R` runs the other one of each pair with multigpu's own R
API, so that every scenario runs in R in the gate.

Needs R with reticulate >= 1.42, keras3, tensorflow and tfdatasets:
`make test-r-parity`, i.e. `R_LIBS=.r-lib .venv/bin/python -m pytest -q
tests/python/test_scenario_parity_keras3.py`. Run it in a pytest process of
its own: R starts once per process, and
keras3 changes S3 dispatch for the whole R session. `MULTIGPU_SKIP_R=1`
skips it.
"""

import json
import os
import subprocess

import pytest

from support import tiers
from support.embedded_r import EmbeddedR
from support.scenario_files import (
    SCENARIO_DIR,
    SCENARIOS,
    error_step,
    scenario_pairs,
    speaks,
)
from support.scenario_parity import PARITY_TOLERANCE, compare_records, parity_summary
from support.scenario_runner import python_record

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.r_parity]


@pytest.fixture(scope="session")
def embedded_r_keras3():
    if os.environ.get("MULTIGPU_SKIP_R") == "1":
        pytest.skip("MULTIGPU_SKIP_R=1: R parity not checked")
    embedded = EmbeddedR(api="keras3")
    yield embedded
    embedded.close()


# Scenarios a keras3 user cannot run as written today, and why (package
# defects, reported; strict: each must fail until it is fixed).
KERAS3_DEFECTS = {
    "mlp_weights_round_trip": (
        "keras3's save_model_weights() calls keras$Model$save_weights(model, "
        "...), the base class's method, not the parallel model's: the file "
        "holds the parallel model's structure, the template inside it. "
        "load_model_weights() into the parallel model reads it (multigpu's "
        "load_weights), but into a fresh template, stock Keras, finds none "
        "('Layer 'hidden' expected 2 variables, but received 0'): save the "
        "template's weights instead"),
}

_largest = {}
# Errors that reached R as reticulate's Python condition (through keras3's
# methods) rather than as multigpu's classed condition, by scenario.
_python_worded = {}


SCENARIO_OF_PAIR = dict(zip(scenario_pairs(SCENARIOS), SCENARIOS))


@pytest.mark.zoo(axes=("member",))
@pytest.mark.parametrize("pair, member", [
    pytest.param(*key, id=s["name"], marks=[
        pytest.mark.xfail(strict=True, reason=KERAS3_DEFECTS[s["name"]])
    ] if s["name"] in KERAS3_DEFECTS else [])
    for key, s in SCENARIO_OF_PAIR.items()])
def test_parity_keras3(pair, member, embedded_r_keras3, tmp_path_factory):
    scenario = SCENARIO_OF_PAIR[pair, member]
    python = python_record(scenario, tmp_path_factory)
    r = embedded_r_keras3.run(SCENARIO_DIR / f"{scenario['name']}.json",
                              tmp_path_factory.mktemp(f"r3-{scenario['name']}"))
    largest, compared = compare_records(python, r)
    if error_step(scenario) is None:
        assert compared > 0, "the scenario recorded no numbers to compare"
    if r.get("error") and r["error"].get("rendered") == "python":
        _python_worded[scenario["name"]] = r["error"]["message"]
    _largest[scenario["name"]] = largest
    assert largest <= PARITY_TOLERANCE, (
        f"R (keras3) and Python differ by {largest:.3g} (> {PARITY_TOLERANCE})")


@pytest.mark.parametrize("turn", [0, 1, 2])
def test_the_r_apis_gate_runs_the_scenarios_this_gate_leaves_out(turn):
    """The gate's two R runs of the scenarios (this one through keras3,
    testthat's through multigpu's R API) together run every scenario, in
    every rotation."""
    keys = list(SCENARIO_OF_PAIR)
    items = [{"pair": pair, "member": str(member)} for pair, member in keys]
    here = {SCENARIO_OF_PAIR[keys[i]]["name"]
            for i in tiers.gate_sample(items, ("member",), turn)}
    testthat = os.path.join(os.path.dirname(SCENARIO_DIR), "testthat")
    script = f"""
        `%||%` <- function(x, y) if (is.null(x)) y else x
        for (helper in c("helper-tiers.R", "helper-scenarios.R")) {{
          source(file.path({json.dumps(testthat)}, helper))
        }}
        files <- scenario_files_for("tensorflow", {json.dumps(str(SCENARIO_DIR))})
        gate <- gate_scenario_files(files, {turn}L)
        cat(jsonlite::toJSON(sub("[.]json$", "", basename(gate))))
    """
    done = subprocess.run(["Rscript", "-e", script], capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, MULTIGPU_TEST_TIER="gate"))
    assert done.returncode == 0, done.stderr[-2000:]
    there = set(json.loads(done.stdout))
    assert len(there) < len(SCENARIOS) and len(here) < len(SCENARIOS)
    assert {s["name"] for s in SCENARIOS} - here - there == set()


def test_keras3_errors_read_in_r():
    """Runs after the parity tests (file order): every error a keras3 user
    met in the scenarios reads in R."""
    if not _largest:
        pytest.skip("no keras3 parity test ran")
    foreign = {name: message for name, message in _python_worded.items()
               if not speaks("r", message)}
    assert not _python_worded, (
        f"{len(_python_worded)} error(s) reached R worded for Python "
        f"({len(foreign)} with Python spellings): {_python_worded}")


def test_parity_keras3_summary(capsys):
    """Runs after the parity tests (file order): prints how many scenarios of
    each kind ran in both languages and the largest difference seen."""
    if not _largest:
        pytest.skip("no keras3 parity test ran")
    line, largest = parity_summary(_largest, "keras3 scenario parity",
                                   "R with keras3")
    line += f"; errors worded for Python: {sorted(_python_worded) or 'none'}"
    with capsys.disabled():
        print(f"\n{line}")
    assert largest <= PARITY_TOLERANCE
