"""The Python runner of the shared scenarios: `PythonRun` runs one scenario
file with the Python API, checks its expectations and records its numbers
(weights, histories, metrics, predictions) and its error, for the parity
check against the R run (`test_scenario_parity_keras3.py`) and the
comparison of the JAX run with the TensorFlow run
(`engines/jax/test_jax_scenarios.py`).

It runs on the Keras backend of its process. On JAX, what a scenario
expects of `multi_gpu_model` reads as the JAX engine's counterpart
(`on_backend`).
"""

import builtins
import math
import pathlib

import keras
import numpy as np

import multigpu
from multigpu import messages
from support.scenario_files import DEVICE_KEYS, recipes, speaks

# Default tolerance of in-language comparisons (predictions against the
# template's, reloaded against saved); a step may set its own.
DEFAULT_TOLERANCE = 1e-5


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


# What a scenario expects of `multi_gpu_model` and `model_parallel` names
# the TensorFlow engines; on JAX these expectations read as their
# counterparts: the model of data parallelism that `engine="auto"` builds
# on logical CPU devices is a `ParallelModel` of the replicate engine on
# TensorFlow, a `ShardedModel` of the JAX engine on JAX; the model of
# `model_parallel` is a `PartitionedModel` (stages) on TensorFlow, a
# `ShardedWeightsModel` (every weight split across the devices) on JAX.
JAX_READINGS = {
    "model_class": {"ParallelModel": "ShardedModel",
                    "PartitionedModel": "ShardedWeightsModel"},
    "engine": {"replicate": "jax"},
}
# Expectations of the TensorFlow engines that have no counterpart on JAX,
# and why they are not checked there.
TENSORFLOW_ONLY = {
    "split": (
        "the rows per device are the replicate engine's slicing "
        "(`ParallelModel.batch_split`); on JAX XLA's partitioner splits each "
        "batch inside the compiled step, in shares of its own choosing "
        "(10 rows on 4 devices: 3, 3, 3 and 1), with no such method"),
    "stages": (
        "`model_parallel` cuts the model into stages on TensorFlow; on JAX "
        "it splits every weight across the devices, with no stages"),
}


def on_backend(expect, backend):
    """What `expect` of a `multi_gpu_model` or `model_parallel` step means on `backend`.

    Args:
        expect: The step's `expect`, as the scenario file writes it.
        backend: `keras.backend.backend()`.

    Returns:
        `expect` itself on TensorFlow; on JAX a copy without the
        `TENSORFLOW_ONLY` expectations, the `JAX_READINGS` read so.
    """
    if backend != "jax":
        return expect
    read = {k: v for k, v in expect.items() if k not in TENSORFLOW_ONLY}
    for key, readings in JAX_READINGS.items():
        if key in read:
            read[key] = readings.get(read[key], read[key])
    return read


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
    """Runs one scenario through the Python API; `record` holds its numbers.

    Args:
        scenario: A loaded scenario (`scenario_files.load_scenario`).
        workdir: A directory for the files the run saves.
        pooled_batch_norm: On TensorFlow, parallelize a model that has
            BatchNormalization layers with `sync_batchnorm=True`, statistics
            over the whole batch, as the JAX engine always takes them: the
            TensorFlow run that a JAX run is compared with.
    """

    def __init__(self, scenario, workdir, pooled_batch_norm=False):
        self.scenario = scenario
        self.backend = keras.backend.backend()
        self.pooled_batch_norm = pooled_batch_norm and self.backend == "tensorflow"
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
                assert isinstance(error, getattr(builtins, expected["class"])), (
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
        if self.pooled_batch_norm and _has_batch_norm(source):
            args["sync_batchnorm"] = True
        expect = on_backend(expect, self.backend)
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
        expect = on_backend(expect, self.backend)
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
        for key in ("drop_remainder", "cache"):
            if key in spec:
                args[key] = spec[key]
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


def _has_batch_norm(model):
    from multigpu.engines.tensorflow.sync_batchnorm import batch_norm_layers

    return isinstance(model, keras.Model) and bool(batch_norm_layers(model))


def _tolerance(value):
    return DEFAULT_TOLERANCE if value is True else float(value)


def _shape_list(shape):
    """A shape, or a list of shapes (one per output), as a list of shapes."""
    if shape and all(isinstance(s, list) for s in shape):
        return shape
    return [shape]


_python_records = {}


def python_record(scenario, tmp_path_factory):
    """The record of `scenario`'s Python run, run once per test session (the
    Python and the parity tests share it)."""
    name = scenario["name"]
    if name not in _python_records:
        workdir = tmp_path_factory.mktemp(f"py-{name}")
        _python_records[name] = PythonRun(scenario, workdir).execute()
    return _python_records[name]
