"""The structure of the shared scenario files (`tests/scenarios/*.json`, format
in its README.md): known steps, expectations and errors, messages spelled
for each language, and enough scenarios of each kind."""

import pytest

from support.scenario_files import (
    BACKENDS,
    DEVICE_KEYS,
    SCENARIOS,
    backends,
    error_step,
    recipes,
    speaks,
)
from support.scenario_runner import JAX_READINGS

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOP_KEYS = {"description", "backends", "recipe", "seed", "data", "devices", "steps"}
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
    "distributed_dataset": {"per_replica_batch_size", "drop_remainder",
                            "cache"},
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


# What the JAX backend does not run (docs/backends.md): strategies and their
# datasets; of `multi_gpu_model`'s arguments, the TensorFlow engines,
# `cpu_merge=False` and `cpu_relocation=True` (the JAX engine refuses them);
# of `model_parallel`'s, the pipeline's `split` and `microbatches` (JAX
# splits the weights, with no stages).
NOT_ON_JAX_STEPS = {"mirrored_strategy", "distributed_dataset"}
JAX_ARGUMENTS = {"engine": ("auto",), "cpu_merge": (True,), "cpu_relocation": (False,)}
JAX_MODEL_PARALLEL_ARGUMENTS = {"split": (None,), "microbatches": (1,)}


def backend_problems(scenario):
    """What keeps a scenario from the backends it names (empty if nothing).

    Every scenario runs on TensorFlow. One that names JAX too calls only
    what runs on JAX (the others refuse with the backend's error), and
    passes the JAX engine only arguments it takes, except in its failing
    step, whose error is compared with TensorFlow's
    (`engines/jax/test_jax_scenarios.py`).
    """
    if "backends" not in scenario:
        return []
    named = scenario["backends"]
    if (not isinstance(named, list) or len(set(named)) != len(named)
            or not set(named) <= set(BACKENDS) or "tensorflow" not in named):
        return [f"`backends` must be a list of distinct names from {list(BACKENDS)} "
                f"that includes 'tensorflow', not {named!r}"]
    if "jax" not in backends(scenario):
        return []
    problems = []
    failing = error_step(scenario)
    for i, step in enumerate(scenario["steps"]):
        op = step["do"]
        if op in NOT_ON_JAX_STEPS or (op == "fit" and "dataset" in step):
            problems.append(f"step {i} ({op}): not on JAX")
        if i != failing and op == "model_parallel":
            for key, allowed in JAX_MODEL_PARALLEL_ARGUMENTS.items():
                if key in step and step[key] not in allowed:
                    problems.append(f"step {i}: {key}={step[key]!r} is refused "
                                    "by model_parallel on JAX")
            if "stages" in step.get("expect", {}):
                problems.append(f"step {i}: expects stages, which JAX's "
                                "model_parallel does not have")
        if i == failing or op != "multi_gpu_model":
            continue
        args = dict(scenario.get("devices", {}), **step)
        for key, allowed in JAX_ARGUMENTS.items():
            if key in args and args[key] not in allowed:
                problems.append(f"step {i}: {key}={args[key]!r} is refused on JAX")
        for key, expected in step.get("expect", {}).items():
            if key == "merge_device" or (
                    key in JAX_READINGS and expected not in JAX_READINGS[key]):
                problems.append(f"step {i}: expects {key}={expected!r}, which "
                                "has no counterpart on JAX")
    return problems


def test_scenario_files_are_well_formed():
    problems = {s["name"]: scenario_problems(s) + backend_problems(s)
                for s in SCENARIOS}
    assert not {k: v for k, v in problems.items() if v}


def test_backend_rules_catch_what_jax_does_not_run():
    on_jax = {"description": "", "backends": ["tensorflow", "jax"], "recipe": "mlp",
              "data": {"seed": 1, "rows": 4}, "devices": {"gpus": 2}}
    assert backend_problems(dict(on_jax, steps=[
        {"do": "build"}, {"do": "multi_gpu_model",
                          "expect": {"engine": "replicate", "split": [4, [2, 2]]}}])) == []
    assert len(backend_problems(dict(on_jax, devices={"gpus": 2, "cpu_merge": False},
                                     steps=[{"do": "build"},
                                            {"do": "multi_gpu_model"}]))) == 1
    assert len(backend_problems(dict(on_jax, steps=[
        {"do": "build"}, {"do": "multi_gpu_model", "engine": "mirrored",
                          "expect": {"merge_device": "/device:CPU:0"}}]))) == 2
    assert backend_problems(dict(on_jax, steps=[
        {"do": "build"}, {"do": "model_parallel", "devices": 2,
                          "expect": {"model_class": "PartitionedModel"}}])) == []
    assert len(backend_problems(dict(on_jax, steps=[
        {"do": "build"}, {"do": "model_parallel", "split": ["scores"],
                          "microbatches": 2,
                          "expect": {"stages": [["hidden"], ["scores"]]}}]))) == 3
    assert len(backend_problems(dict(on_jax, steps=[
        {"do": "mirrored_strategy", "devices": 1,
         "error": {"class": "ValueError", "message": "not 1"}}]))) == 1
    assert backend_problems(dict(on_jax, steps=[
        {"do": "build"}, {"do": "fit", "epochs": 1, "checkpoint": True}])) == []
    assert len(backend_problems(dict(on_jax, steps=[
        {"do": "build"}, {"do": "fit", "epochs": 1,
                          "dataset": {"per_replica_batch_size": 2}}]))) == 1
    assert len(backend_problems(dict(on_jax, backends=["jax"], steps=[]))) == 1


def test_there_are_enough_scenarios_of_each_kind():
    invalid = [s for s in SCENARIOS if error_step(s) is not None]
    assert len(SCENARIOS) >= 20
    assert 3 * len(invalid) >= len(SCENARIOS)
    valid_recipes = {s["recipe"] for s in SCENARIOS if error_step(s) is None}
    assert {"mlp", "cnn", "two_io", "shared_submodel", "batchnorm",
            "rnn"} <= valid_recipes
