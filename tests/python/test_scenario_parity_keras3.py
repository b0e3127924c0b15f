"""Parity through the keras3 R API: every shared scenario run in R as a keras3
user writes it (keras3 and tfdatasets attached, keras3's compile/fit/
evaluate/predict methods, optimizers, losses and metrics from keras3's
constructors; see `tests/testthat/helper-scenarios-keras3.R`), embedded in
this process, gives the numbers and the errors of its Python run
(`compare_records` of `scenario_parity.py`, within `PARITY_TOLERANCE`).

Needs R with reticulate >= 1.42, keras3, tensorflow and tfdatasets:
`make test-r-parity`, i.e. `R_LIBS=.r-lib .venv/bin/python -m pytest -q
tests/python/test_scenario_parity_keras3.py`. Run it in a pytest process of
its own: R starts once per process, and
keras3 changes S3 dispatch for the whole R session. `MULTIGPU_SKIP_R=1`
skips it.
"""

import os

import pytest

from support.embedded_r import EmbeddedR
from support.scenario_files import IDS, SCENARIO_DIR, SCENARIOS, error_step, speaks
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


@pytest.mark.parametrize("scenario", [
    pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KERAS3_DEFECTS[n]))
    if n in KERAS3_DEFECTS else s for s, n in zip(SCENARIOS, IDS)], ids=IDS)
def test_parity_keras3(scenario, embedded_r_keras3, tmp_path_factory):
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
