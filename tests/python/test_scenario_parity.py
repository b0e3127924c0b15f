"""Parity: every shared scenario run in R (embedded in this process, see
`embedded_r.py`) gives the numbers and the errors of its Python run, within
`PARITY_TOLERANCE`. Needs R, and NumPy 1 with reticulate < 1.38 (`make
test-python-numpy1`); `MULTIGPU_SKIP_R=1` skips it."""

import os
import re

import numpy as np
import pytest

from embedded_r import EmbeddedR
from scenario_files import IDS, SCENARIO_DIR, SCENARIOS, error_step, speaks
from scenario_runner import flat, max_difference, python_record

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Largest allowed difference between the Python and the R run of a scenario:
# predictions, weights, losses and metrics (relative above 1).
PARITY_TOLERANCE = 1e-6


@pytest.fixture(scope="session")
def embedded_r():
    if os.environ.get("MULTIGPU_SKIP_R") == "1":
        pytest.skip("MULTIGPU_SKIP_R=1: R parity not checked")
    embedded = EmbeddedR()
    yield embedded
    # Release the R function while R and rpy2 are still fully alive, rather
    # than during interpreter shutdown (where rpy2's callbacks are gone).
    embedded.close()


def compare_records(python, r):
    """Compares the Python and R records of one scenario.

    Fails on a structural mismatch (other steps, other recorded keys, other
    shapes) or a different error: the same Python exception class, and, when
    R's error came from Python, the same message. Returns the largest
    numerical difference (absolute; relative above 1 for losses and
    metrics) and how many numbers were compared.
    """
    p_error, r_error = python["error"], r.get("error")
    assert (p_error is None) == (r_error is None), (
        f"Python error: {p_error}; R error: {r_error}")
    if p_error is not None:
        assert p_error["class"] == r_error["class"], (p_error, r_error)
        # The core's message, rendered in R: the same facts in R spelling.
        # An exception that reached R as reticulate's condition (through
        # keras3's methods, not multigpu's bridge) has the Python wording:
        # it must be the Python run's message itself.
        in_r = r_error.get("rendered", "r") == "r"
        if r_error["from_python"]:
            expected = p_error["message_r"] if in_r else p_error["message"]
            assert _process_state_out(expected) == _process_state_out(
                r_error["message"])
        if in_r:
            assert speaks("r", r_error["message"]), r_error["message"]
    largest, compared = 0.0, 0

    def arrays(p_value, r_value):
        nonlocal largest, compared
        largest = max(largest, max_difference(p_value, _as_list(r_value)))
        compared += sum(a.size for a in flat(p_value))

    for key in ("initial_weights", "final_weights"):
        assert (python[key] is None) == (r.get(key) is None), key
        if python[key] is not None:
            arrays(python[key], r[key])
    assert [s["do"] for s in python["steps"]] == [s["do"] for s in r["steps"]]
    for p_step, r_step in zip(python["steps"], r["steps"]):
        assert sorted(p_step) == sorted(r_step), (p_step["do"], sorted(r_step))
        if "predictions" in p_step:
            arrays(p_step["predictions"], r_step["predictions"])
        for key in ("history", "metrics"):
            if key not in p_step:
                continue
            p_values, r_values = p_step[key], dict(r_step[key])
            assert sorted(p_values) == sorted(r_values), key
            for name, values in p_values.items():
                p_array = np.atleast_1d(np.asarray(values, "float64"))
                r_array = np.atleast_1d(np.asarray(r_values[name], "float64"))
                assert p_array.shape == r_array.shape, (key, name)
                scale = np.maximum(1.0, np.abs(p_array))
                largest = max(largest, float(np.max(
                    np.abs(p_array - r_array) / scale)))
                compared += p_array.size
    return largest, compared


# What a refused virtual_devices() finds alive ("still exist (158 tensors,
# 12 Keras models, ...)") counts the objects of the whole process, in which
# the Python run of a scenario precedes its R run: that list is left out of
# the comparison, the rest of the message is compared as it is.
_ALIVE = re.compile(r"(still exist) \([^)]*\)")


def _process_state_out(message):
    return _ALIVE.sub(r"\1 (...)", message)


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


_largest = {}


@pytest.mark.r_parity
@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_parity(scenario, embedded_r, tmp_path_factory):
    python = python_record(scenario, tmp_path_factory)
    r = embedded_r.run(SCENARIO_DIR / f"{scenario['name']}.json",
                       tmp_path_factory.mktemp(f"r-{scenario['name']}"))
    largest, compared = compare_records(python, r)
    if error_step(scenario) is None:
        assert compared > 0, "the scenario recorded no numbers to compare"
    _largest[scenario["name"]] = largest
    assert largest <= PARITY_TOLERANCE, (
        f"R and Python differ by {largest:.3g} (> {PARITY_TOLERANCE})")


@pytest.mark.r_parity
def test_parity_summary(capsys):
    """Runs after the parity tests (file order): prints how many scenarios of
    each kind ran in both languages and the largest difference seen."""
    if not _largest:
        pytest.skip("no parity test ran")
    line, largest = parity_summary(_largest, "scenario parity", "R")
    with capsys.disabled():
        print(f"\n{line}")
    assert largest <= PARITY_TOLERANCE


def parity_summary(largest_by_scenario, title, r_side):
    """The summary line of a parity run and its largest difference.

    Args:
        largest_by_scenario: The largest difference of each scenario run.
        title: What ran, e.g. "scenario parity".
        r_side: How R ran, e.g. "R" or "R with keras3".

    Returns:
        `(line, largest)`.
    """
    name = max(largest_by_scenario, key=largest_by_scenario.get)
    largest = largest_by_scenario[name]
    invalid = sum(error_step(s) is not None for s in SCENARIOS
                  if s["name"] in largest_by_scenario)
    count = len(largest_by_scenario)
    line = (f"{title}: {count} scenarios in Python and {r_side} "
            f"({count - invalid} valid, {invalid} invalid-input); "
            f"largest difference {largest:.3g}"
            f"{f' ({name})' if largest else ' (bitwise identical)'}")
    return line, largest
