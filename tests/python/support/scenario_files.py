"""The shared scenarios, `tests/scenarios/*.json`, as the Python tests load
them, and what both languages' runs share: which language a message speaks.

The scenario format is described in `tests/scenarios/README.md`. Each file is
run with the Python API (`scenario_runner.py`, by `test_scenario_python.py`)
and with the R API (`tests/testthat/helper-scenarios.R`, by the R package's
`test-scenarios.R` and, in R embedded here, by `test_scenario_parity_keras3.py`);
a file whose `backends` name JAX runs on JAX too, compared with its TensorFlow
run (`engines/jax/test_jax_scenarios.py`).
`test_scenario_schema.py` checks the files' structure.
"""

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
SCENARIO_DIR = ROOT / "tests" / "scenarios"
sys.path.insert(0, str(SCENARIO_DIR))
# No __pycache__ in tests/scenarios (it would end up in the R package).
_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
import recipes  # noqa: E402

sys.dont_write_bytecode = _write_bytecode

__all__ = ["BACKENDS", "DEFAULT_BACKENDS", "DEVICE_KEYS", "IDS", "ROOT", "SCENARIOS",
           "SCENARIO_DIR", "backends", "error_step", "load_scenario", "recipes",
           "scenario_paths", "speaks"]

# The keys of a scenario's `devices`, which a multi_gpu_model step may set
# too: the arguments of multi_gpu_model().
DEVICE_KEYS = {"gpus", "cpu_merge", "cpu_relocation", "engine"}

# The Keras backends a scenario may run on (its `backends`), and those of a
# scenario that names none.
BACKENDS = ("tensorflow", "jax")
DEFAULT_BACKENDS = ("tensorflow",)

# Spellings that belong to one language only: an R user must not read Python
# values or calls, nor a Python user R's.
PYTHON_ONLY = re.compile(r"\b(None|True|False)\b|\[['\"0-9-]|\bmultigpu\.[a-z_]+\(")
R_ONLY = re.compile(r"\b(NULL|TRUE|FALSE)\b|\b(c|list)\(")


def speaks(language, message):
    """Whether `message` reads in `language` ("python" or "r"): none of the
    other language's spellings of values and calls."""
    foreign = R_ONLY if language == "python" else PYTHON_ONLY
    return foreign.search(message) is None


def scenario_paths():
    return sorted(SCENARIO_DIR.glob("*.json"))


def load_scenario(path):
    with open(path) as handle:
        scenario = json.load(handle)
    scenario["name"] = pathlib.Path(path).stem
    return scenario


def backends(scenario):
    """The Keras backends `scenario` runs on: its `backends`, TensorFlow alone by default."""
    return list(scenario.get("backends", DEFAULT_BACKENDS))


def error_step(scenario):
    """Index of the step expected to fail, or None for a valid scenario."""
    marked = [i for i, s in enumerate(scenario["steps"]) if "error" in s]
    return marked[0] if marked else None


def scenario_pairs(scenarios):
    """The scenarios as a zoo: `(pair, member)` of each scenario, in order.

    A recipe's valid scenarios are taken two at a time (a pair is a case,
    its member the axis), so the gate runs one of each pair, in turn
    with the rotation, and every recipe; an invalid-input scenario is a
    case of its own, which the gate always runs (errors are cheap, and
    every one must read in R).

    Args:
        scenarios: The scenario dicts, in file order.

    Returns:
        One `(pair, member)` per scenario, e.g. `("mlp-0", 1)`.
    """
    seen = {}
    pairs = []
    for scenario in scenarios:
        if error_step(scenario) is not None:
            pairs.append((scenario["name"], 0))
            continue
        count = seen.get(scenario["recipe"], 0)
        seen[scenario["recipe"]] = count + 1
        pairs.append((f"{scenario['recipe']}-{count // 2}", count % 2))
    return pairs


SCENARIOS = [load_scenario(p) for p in scenario_paths()]
IDS = [s["name"] for s in SCENARIOS]
