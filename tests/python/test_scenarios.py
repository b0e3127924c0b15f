"""Shared scenarios: every `tests/scenarios/*.json`, run with the Python API,
and run again with the R API (R embedded in this process with rpy2) to check
that both languages give the same numbers and the same errors.

The scenario format is described in `tests/scenarios/README.md`. The R runner
is `tests/testthat/helper-scenarios.R`; the R package's test suite runs it
from `tests/testthat/test-scenarios.R`, and `test_parity` runs it here.
"""

import atexit
import gc
import json
import math
import os
import pathlib
import re
import sys

import keras
import numpy as np
import pytest

import multigpu
from multigpu import messages

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIO_DIR = ROOT / "tests" / "scenarios"
R_HELPER = ROOT / "tests" / "testthat" / "helper-scenarios.R"
sys.path.insert(0, str(SCENARIO_DIR))
# No __pycache__ in tests/scenarios (it would end up in the R package).
_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
import recipes  # noqa: E402

sys.dont_write_bytecode = _write_bytecode

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Largest allowed difference between the Python and the R run of a scenario:
# predictions, weights, losses and metrics (relative above 1).
PARITY_TOLERANCE = 1e-6
# Default tolerance of in-language comparisons (predictions against the
# template's, reloaded against saved); a step may set its own.
DEFAULT_TOLERANCE = 1e-5

TOP_KEYS = {"description", "recipe", "seed", "data", "devices", "steps"}
DEVICE_KEYS = {"gpus", "cpu_merge", "cpu_relocation", "engine"}
STEP_KEYS = {
    "build": {"in_strategy"},
    "multi_gpu_model": DEVICE_KEYS | {"on"},
    "model_parallel": {"devices", "split", "microbatches"},
    "mirrored_strategy": {"devices"},
    "compile": {"optimizer", "loss", "metrics"},
    "fit": {"epochs", "batch_size", "validation_split", "dataset",
            "checkpoint"},
    "evaluate": {"batch_size"},
    "predict": {"batch_size", "on"},
    "save": {"file"},
    "reload": {"file"},
    "save_weights": {"file"},
    "load_weights": {"file", "seed"},
    "make_or_restore_model": {"compile"},
    "distributed_dataset": {"per_replica_batch_size", "drop_remainder"},
    "checkpoint_callbacks": {"save_freq"},
    "virtual_devices": {"n"},
}
EXPECT_KEYS = {
    "build": {"params"},
    "multi_gpu_model": {"model_class", "engine", "devices", "merge_device",
                        "template_is_model", "weights_kept", "split",
                        "output_names"},
    "model_parallel": {"model_class", "stages", "output_names"},
    "mirrored_strategy": {"replicas"},
    "compile": set(),
    "fit": {"epochs_run", "loss_decreases", "keys", "template_trained",
            "equals_reference"},
    "evaluate": {"keys", "finite"},
    "predict": {"shape", "equals_template", "finite"},
    "save": set(),
    "reload": {"equals_before_save", "compiled"},
    "save_weights": set(),
    "load_weights": {"equals_saved"},
    "make_or_restore_model": {"restored"},
    "distributed_dataset": set(),
    "checkpoint_callbacks": set(),
    "virtual_devices": set(),
}
ERROR_CLASSES = {"ValueError", "TypeError", "RuntimeError", "OSError"}
ERROR_KEYS = {"class", "message", "message_r"}

# Spellings that belong to one language only: an R user must not read Python
# values or calls, nor a Python user R's.
PYTHON_ONLY = re.compile(r"\b(None|True|False)\b|\[['\"0-9-]|\bmultigpu\.[a-z_]+\(")
R_ONLY = re.compile(r"\b(NULL|TRUE|FALSE)\b|\b(c|list)\(")


def speaks(language, message):
    """Whether `message` reads in `language` ("python" or "r"): none of the
    other language's spellings of values and calls."""
    foreign = R_ONLY if language == "python" else PYTHON_ONLY
    return foreign.search(message) is None


# ---------------------------------------------------------------------------
# Loading and checking the scenario files.


def scenario_paths():
    return sorted(SCENARIO_DIR.glob("*.json"))


def load_scenario(path):
    with open(path) as handle:
        scenario = json.load(handle)
    scenario["name"] = pathlib.Path(path).stem
    return scenario


def error_step(scenario):
    """Index of the step expected to fail, or None for a valid scenario."""
    marked = [i for i, s in enumerate(scenario["steps"]) if "error" in s]
    return marked[0] if marked else None


def scenario_problems(scenario):
    """What is wrong with a scenario file's structure (empty if nothing)."""
    problems = []
    for key in ("description", "recipe", "data", "steps"):
        if key not in scenario:
            problems.append(f"missing key {key!r}")
    unknown = set(scenario) - TOP_KEYS - {"name"}
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)}")
    if scenario.get("recipe") not in recipes.RECIPES:
        problems.append(f"unknown recipe {scenario.get('recipe')!r}")
    if set(scenario.get("devices", {})) - DEVICE_KEYS:
        problems.append(f"unknown device keys "
                        f"{sorted(set(scenario['devices']) - DEVICE_KEYS)}")
    if set(scenario.get("data", {})) != {"seed", "rows"}:
        problems.append("`data` must have exactly `seed` and `rows`")
    steps = scenario.get("steps", [])
    if not steps or not all(isinstance(s, dict) and "do" in s for s in steps):
        problems.append("`steps` must be a non-empty list of {\"do\": ...}")
        return problems
    for i, step in enumerate(steps):
        op = step["do"]
        if op not in STEP_KEYS:
            problems.append(f"step {i}: unknown op {op!r}")
            continue
        extra = set(step) - STEP_KEYS[op] - {"do", "expect", "error"}
        if extra:
            problems.append(f"step {i} ({op}): unknown keys {sorted(extra)}")
        extra = set(step.get("expect", {})) - EXPECT_KEYS[op]
        if extra:
            problems.append(f"step {i} ({op}): unknown expectations "
                            f"{sorted(extra)}")
        if "error" in step:
            error = step["error"]
            if i != len(steps) - 1:
                problems.append(f"step {i} ({op}): a failing step must be last")
            if error.get("class") not in ERROR_CLASSES or not error.get(
                    "message"):
                problems.append(f"step {i} ({op}): `error` needs a `class` "
                                f"in {sorted(ERROR_CLASSES)} and a `message`")
            if set(error) - ERROR_KEYS:
                problems.append(f"step {i} ({op}): unknown error keys "
                                f"{sorted(set(error) - ERROR_KEYS)}")
            if not speaks("python", error.get("message", "")):
                problems.append(f"step {i} ({op}): `message` must be the "
                                "Python spelling")
            if not speaks("r", error.get("message_r", error.get("message", ""))):
                problems.append(f"step {i} ({op}): the message contains Python "
                                "values or calls: give `message_r`, its R "
                                "spelling")
    return problems


SCENARIOS = [load_scenario(p) for p in scenario_paths()]
IDS = [s["name"] for s in SCENARIOS]


def test_scenario_files_are_well_formed():
    problems = {s["name"]: scenario_problems(s) for s in SCENARIOS}
    assert not {k: v for k, v in problems.items() if v}


def test_there_are_enough_scenarios_of_each_kind():
    invalid = [s for s in SCENARIOS if error_step(s) is not None]
    assert len(SCENARIOS) >= 20
    assert 3 * len(invalid) >= len(SCENARIOS)
    valid_recipes = {s["recipe"] for s in SCENARIOS if error_step(s) is None}
    assert {"mlp", "cnn", "two_io", "shared_submodel", "batchnorm",
            "rnn"} <= valid_recipes


# ---------------------------------------------------------------------------
# The Python runner.


def flat(value):
    """Predictions or weights as a flat list of float64 arrays."""
    if isinstance(value, dict):
        value = [value[k] for k in sorted(value)]
    return [np.asarray(v, dtype="float64") for v in keras.tree.flatten(value)]


def max_difference(a, b):
    a, b = flat(a), flat(b)
    assert len(a) == len(b), f"{len(a)} arrays against {len(b)}"
    for u, v in zip(a, b):
        assert u.shape == v.shape, f"shapes {u.shape} and {v.shape}"
    return max((float(np.max(np.abs(u - v))) if u.size else 0.0
                for u, v in zip(a, b)), default=0.0)


def shapes(value):
    return [list(np.shape(v)) for v in keras.tree.flatten(value)]


def compile_arguments(step):
    optimizer = step.get("optimizer", "rmsprop")
    if isinstance(optimizer, dict):
        optimizer = dict(optimizer)
        optimizer = getattr(keras.optimizers, optimizer.pop("class"))(
            **optimizer)
    args = {"optimizer": optimizer, "loss": step["loss"]}
    if "metrics" in step:
        args["metrics"] = step["metrics"]
    return args


class PythonRun:
    """Runs one scenario through the Python API; `record` holds its numbers."""

    def __init__(self, scenario, workdir):
        self.scenario = scenario
        self.workdir = pathlib.Path(workdir)
        data = recipes.make_data(scenario["recipe"], scenario["data"]["seed"],
                                 scenario["data"]["rows"])
        self.x, self.y = data["x"], data["y"]
        self.model = self.template = self.strategy = None
        self.saved = {}
        self.record = {"initial_weights": None, "steps": [],
                       "final_weights": None, "error": None}

    def execute(self):
        steps = self.scenario["steps"]
        for index, step in enumerate(steps):
            where = f"step {index} ({step['do']})"
            entry = {"do": step["do"]}
            self.record["steps"].append(entry)
            expected = step.get("error")
            try:
                getattr(self, "do_" + step["do"])(step, step.get("expect", {}),
                                                  entry)
            except AssertionError as failure:
                raise AssertionError(f"{where}: {failure}") from failure
            except Exception as error:
                if expected is None:
                    raise
                actual = type(error).__name__
                assert isinstance(error, _builtin(expected["class"])), (
                    f"{where}: expected {expected['class']}, got {actual}: "
                    f"{error}")
                assert expected["message"] in str(error), (
                    f"{where}: message {str(error)!r} lacks "
                    f"{expected['message']!r}")
                assert speaks("python", str(error)), (
                    f"{where}: the Python message has R spellings: {error}")
                self.record["error"] = {"class": expected["class"],
                                        "message": str(error),
                                        "message_r": self.message_in_r(step),
                                        "from_python": True}
                return self.record
            assert expected is None, (
                f"{where}: expected {expected['class']} "
                f"({expected['message']!r}), but it succeeded")
        if self.template is not None:
            self.record["final_weights"] = self.template.get_weights()
        return self.record

    def message_in_r(self, step):
        """The failing step's message as the R package renders it: the step
        run again with messages in R (an invalid input fails the same way)."""
        with messages.language("r"):
            try:
                getattr(self, "do_" + step["do"])(step, step.get("expect", {}),
                                                  {"do": step["do"]})
            except Exception as error:  # noqa: BLE001 - its message is the point
                return str(error)
        raise AssertionError(f"{step['do']} failed once, then succeeded")

    # -- steps ---------------------------------------------------------------

    def _in_scope(self, fn):
        if self.strategy is None:
            return fn()
        with self.strategy.scope():
            return fn()

    def do_build(self, step, expect, entry):
        model = self._in_scope(lambda: recipes.build(self.scenario["recipe"],
                                                     self.scenario["seed"]))
        self.model = self.template = model
        if isinstance(model, keras.Model):
            self.record["initial_weights"] = model.get_weights()
        if "params" in expect:
            assert model.count_params() == expect["params"]

    def do_multi_gpu_model(self, step, expect, entry):
        args = dict(self.scenario.get("devices", {}))
        args.update({k: step[k] for k in DEVICE_KEYS if k in step})
        source = self.model
        before = source.get_weights() if isinstance(source, keras.Model) else None
        parallel = multigpu.multi_gpu_model(source, **args)
        self.model, self.template = parallel, parallel.template
        if "model_class" in expect:
            assert type(parallel).__name__ == expect["model_class"]
        if "engine" in expect:
            assert parallel.engine == expect["engine"]
        if "devices" in expect:
            assert parallel.devices == expect["devices"]
        if "merge_device" in expect:
            assert parallel.merge_device == expect["merge_device"]
        if "template_is_model" in expect:
            assert (parallel.template is source) == expect["template_is_model"]
        if expect.get("weights_kept"):
            assert max_difference(parallel.template.get_weights(), before) == 0
        if "split" in expect:
            batch, rows = expect["split"]
            assert [n for _, n in parallel.batch_split(batch)] == rows
        if "output_names" in expect:
            assert parallel.output_names == expect["output_names"]

    def do_model_parallel(self, step, expect, entry):
        args = {k: step[k] for k in ("devices", "split", "microbatches")
                if k in step}
        partitioned = multigpu.model_parallel(self.model, **args)
        self.model, self.template = partitioned, partitioned.template
        if "model_class" in expect:
            assert type(partitioned).__name__ == expect["model_class"]
        if "stages" in expect:
            assert partitioned.stages == expect["stages"]
        if "output_names" in expect:
            assert partitioned.output_names == expect["output_names"]

    def do_mirrored_strategy(self, step, expect, entry):
        self.strategy = multigpu.mirrored_strategy(step.get("devices"))
        if "replicas" in expect:
            assert self.strategy.num_replicas_in_sync == expect["replicas"]

    def do_compile(self, step, expect, entry):
        self._in_scope(lambda: self.model.compile(**compile_arguments(step)))
        self.compile_step = step

    def _reference_fit(self, fit_args):
        """A fresh model of the recipe, compiled and fit alike on one device."""
        reference = recipes.build(self.scenario["recipe"],
                                  self.scenario["seed"])
        reference.compile(**compile_arguments(self.compile_step))
        reference.fit(self.x, self.y, **fit_args)
        return reference

    def do_fit(self, step, expect, entry):
        args = {"epochs": step.get("epochs", 1), "verbose": 0,
                "shuffle": False}
        if "dataset" in step:
            data = self._dataset(step["dataset"])
            x, y = data, None
        else:
            x, y = self.x, self.y
            if "batch_size" in step:
                args["batch_size"] = step["batch_size"]
        if "validation_split" in step:
            args["validation_split"] = step["validation_split"]
        if step.get("checkpoint"):
            args["callbacks"] = multigpu.checkpoint_callbacks(
                str(self.workdir / "checkpoints"))
        before = self.template.get_weights()
        history = self.model.fit(x, y, **args).history
        if "template_trained" in expect:
            changed = max_difference(self.template.get_weights(), before) > 0
            assert changed == expect["template_trained"]
        entry["history"] = {k: [float(v) for v in history[k]]
                            for k in sorted(history)}
        losses = history.get("loss", [])
        if "epochs_run" in expect:
            assert len(losses) == expect["epochs_run"]
        if expect.get("loss_decreases"):
            assert len(losses) >= 2 and losses[-1] < losses[0], losses
        if "keys" in expect:
            assert sorted(history) == sorted(expect["keys"])
        if "equals_reference" in expect:
            args.pop("callbacks", None)
            reference = self._reference_fit(args)
            assert max_difference(self.template.get_weights(),
                                  reference.get_weights()) <= _tolerance(
                expect["equals_reference"])

    def _dataset(self, spec):
        args = {"per_replica_batch_size": spec["per_replica_batch_size"],
                "strategy": self.strategy}
        if "drop_remainder" in spec:
            args["drop_remainder"] = spec["drop_remainder"]
        return multigpu.distributed_dataset(self.x, self.y, **args)

    def do_distributed_dataset(self, step, expect, entry):
        self._dataset(step)

    def do_evaluate(self, step, expect, entry):
        args = {"verbose": 0, "return_dict": True}
        if "batch_size" in step:
            args["batch_size"] = step["batch_size"]
        result = self.model.evaluate(self.x, self.y, **args)
        entry["metrics"] = {k: float(result[k]) for k in sorted(result)}
        if "keys" in expect:
            assert sorted(result) == sorted(expect["keys"])
        if expect.get("finite"):
            assert all(math.isfinite(v) for v in entry["metrics"].values())

    def _predict(self, model, step):
        args = {"verbose": 0}
        if "batch_size" in step:
            args["batch_size"] = step["batch_size"]
        return model.predict(self.x, **args)

    def do_predict(self, step, expect, entry):
        model = self.template if step.get("on") == "template" else self.model
        predictions = self._predict(model, step)
        entry["predictions"] = flat(predictions)
        if "shape" in expect:
            assert shapes(predictions) == _shape_list(expect["shape"])
        if expect.get("finite"):
            assert all(np.all(np.isfinite(p)) for p in flat(predictions))
        if "equals_template" in expect:
            tolerance = _tolerance(expect["equals_template"])
            reference = self._predict(self.template, step)
            assert max_difference(predictions, reference) <= tolerance

    def do_save(self, step, expect, entry):
        path = self.workdir / step["file"]
        self.saved[step["file"]] = self._predict(self.model, {})
        self.model.save(path)

    def do_reload(self, step, expect, entry):
        loaded = keras.models.load_model(self.workdir / step["file"])
        assert not isinstance(loaded, multigpu.ParallelModel)
        predictions = self._predict(loaded, {})
        entry["predictions"] = flat(predictions)
        if "equals_before_save" in expect:
            tolerance = _tolerance(expect["equals_before_save"])
            assert max_difference(predictions, self.saved[step["file"]]) <= (
                tolerance)
        if "compiled" in expect:
            assert loaded.compiled == expect["compiled"]
        self.model = self.template = loaded

    def do_save_weights(self, step, expect, entry):
        self.saved[step["file"]] = self._predict(self.model, {})
        self.model.save_weights(self.workdir / step["file"])

    def do_load_weights(self, step, expect, entry):
        fresh = recipes.build(self.scenario["recipe"], step["seed"])
        fresh.load_weights(self.workdir / step["file"])
        predictions = self._predict(fresh, {})
        entry["predictions"] = flat(predictions)
        if "equals_saved" in expect:
            assert max_difference(predictions, self.saved[step["file"]]) <= (
                _tolerance(expect["equals_saved"]))

    def do_make_or_restore_model(self, step, expect, entry):
        built = []
        previous = self.model

        def build_fn():
            built.append(True)
            model = recipes.build(self.scenario["recipe"], self.scenario["seed"])
            model.compile(**compile_arguments(step["compile"]))
            return model

        model = self._in_scope(lambda: multigpu.make_or_restore_model(
            str(self.workdir / "checkpoints"), build_fn))
        if self.record["initial_weights"] is None and built:
            self.record["initial_weights"] = model.get_weights()
        if "restored" in expect:
            assert (not built) == expect["restored"]
            if expect["restored"] and previous is not None:
                assert max_difference(model.get_weights(),
                                      previous.get_weights()) <= 1e-7
        self.model = self.template = model

    def do_checkpoint_callbacks(self, step, expect, entry):
        multigpu.checkpoint_callbacks(str(self.workdir / "checkpoints"),
                                      save_freq=step["save_freq"])

    def do_virtual_devices(self, step, expect, entry):
        multigpu.virtual_devices(step["n"])


def _builtin(name):
    import builtins
    return getattr(builtins, name)


def _tolerance(value):
    return DEFAULT_TOLERANCE if value is True else float(value)


def _shape_list(shape):
    """A shape, or a list of shapes (one per output), as a list of shapes."""
    if shape and all(isinstance(s, list) for s in shape):
        return shape
    return [shape]


_python_records = {}


def python_record(scenario, tmp_path_factory):
    name = scenario["name"]
    if name not in _python_records:
        workdir = tmp_path_factory.mktemp(f"py-{name}")
        _python_records[name] = PythonRun(scenario, workdir).execute()
    return _python_records[name]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_scenario_python(scenario, tmp_path_factory):
    python_record(scenario, tmp_path_factory)


# ---------------------------------------------------------------------------
# R, embedded in this process.


class EmbeddedR:
    """R embedded with rpy2, the multigpu R package and the R runner loaded.

    reticulate, loaded in the embedded R, attaches to this Python
    interpreter: R calls the same TensorFlow runtime, with the same 4
    logical devices, so both runs of a scenario start from the same state.

    rpy2 is used only to start R and load the runner. The scenarios are run
    by calling the R runner as a Python function (reticulate turns an R
    function into a Python callable): rpy2 releases the GIL while R runs,
    and reticulate 1.28's finalizers of Python objects, run by R's garbage
    collector, then crash the process; called through reticulate, R runs
    with the GIL held.
    """

    def __init__(self):
        os.environ.setdefault("RETICULATE_PYTHON", sys.executable)
        import rpy2.rinterface
        import rpy2.robjects as robjects
        # rpy2 ends R at exit, after reticulate released this interpreter's
        # thread state: Python then aborts ("GIL is released").
        atexit.unregister(rpy2.rinterface.endr)
        robjects.r(R_SETUP.format(root=_r_string(ROOT),
                                  helper=_r_string(R_HELPER),
                                  scenarios=_r_string(SCENARIO_DIR)))
        self.runner = recipes.R_RUNNER

    def close(self):
        self.runner = recipes.R_RUNNER = None
        gc.collect()
        # reticulate lets R process its events from Python's pending calls,
        # also while Python shuts down, when rpy2's event callback is gone.
        from rpy2.rinterface_lib import openrlib
        openrlib.rlib.ptr_R_ProcessEvents = openrlib.ffi.NULL

    def run(self, scenario_path, workdir):
        name = pathlib.Path(scenario_path).stem
        recipes.R_RECORDS.pop(name, None)
        self.runner(str(scenario_path), str(workdir))
        return recipes.R_RECORDS.pop(name)


R_SETUP = """
suppressPackageStartupMessages({{
  library(testthat)
  if (requireNamespace("pkgload", quietly = TRUE) &&
      file.exists(file.path({root}, "NAMESPACE"))) {{
    pkgload::load_all({root}, export_all = FALSE, helpers = FALSE,
                      attach_testthat = FALSE, quiet = TRUE)
  }} else {{
    library(multigpu)
  }}
}})
sys.source({helper}, envir = globalenv())
reticulate::py_set_attr(scenario_recipes({scenarios}), "R_RUNNER",
                        run_scenario_for_python)
"""


def _r_string(path):
    return json.dumps(str(path))


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
        if r_error["from_python"]:
            assert p_error["message_r"] == r_error["message"]
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
    name = max(_largest, key=_largest.get)
    invalid = sum(error_step(s) is not None for s in SCENARIOS
                  if s["name"] in _largest)
    line = (f"scenario parity: {len(_largest)} scenarios in Python and R "
            f"({len(_largest) - invalid} valid, {invalid} invalid-input); "
            f"largest difference {_largest[name]:.3g}"
            f"{f' ({name})' if _largest[name] else ' (bitwise identical)'}")
    with capsys.disabled():
        print(f"\n{line}")
    assert _largest[name] <= PARITY_TOLERANCE
