"""How a scenario's R run is compared with its Python run: `compare_records`
(the numbers and the errors, within `PARITY_TOLERANCE`) and `parity_summary`,
used by `test_scenario_parity_keras3.py`, which runs every shared scenario
through the keras3 R API (R embedded in the pytest process, see
`embedded_r.py`). `compare_numbers` compares two records' numbers, for
that check and for the comparison of backends (`scenario_backends.py`)."""

import re

import numpy as np

from support.scenario_files import SCENARIOS, error_step, speaks
from support.scenario_runner import flat, max_difference

# Largest allowed difference between the Python and the R run of a scenario:
# predictions, weights, losses and metrics (relative above 1).
PARITY_TOLERANCE = 1e-6


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
    return compare_numbers(python, r)


def compare_numbers(reference, other):
    """Compares the numbers of two records of one scenario.

    Fails on a structural mismatch (other steps, other recorded keys, other
    shapes). Returns the largest difference of `other`'s numbers from
    `reference`'s (absolute for weights and predictions; relative above 1
    for losses and metrics) and how many numbers were compared.
    """
    largest, compared = 0.0, 0

    def arrays(ref_value, other_value):
        nonlocal largest, compared
        largest = max(largest, max_difference(ref_value, _as_list(other_value)))
        compared += sum(a.size for a in flat(ref_value))

    for key in ("initial_weights", "final_weights"):
        assert (reference[key] is None) == (other.get(key) is None), key
        if reference[key] is not None:
            arrays(reference[key], other[key])
    assert [s["do"] for s in reference["steps"]] == [s["do"] for s in other["steps"]]
    for ref_step, other_step in zip(reference["steps"], other["steps"]):
        assert sorted(ref_step) == sorted(other_step), (
            ref_step["do"], sorted(other_step))
        if "predictions" in ref_step:
            arrays(ref_step["predictions"], other_step["predictions"])
        for key in ("history", "metrics"):
            if key not in ref_step:
                continue
            ref_values, other_values = ref_step[key], dict(other_step[key])
            assert sorted(ref_values) == sorted(other_values), key
            for name, values in ref_values.items():
                ref_array = np.atleast_1d(np.asarray(values, "float64"))
                other_array = np.atleast_1d(np.asarray(other_values[name], "float64"))
                assert ref_array.shape == other_array.shape, (key, name)
                scale = np.maximum(1.0, np.abs(ref_array))
                largest = max(largest, float(np.max(
                    np.abs(ref_array - other_array) / scale)))
                compared += ref_array.size
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
