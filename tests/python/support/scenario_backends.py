"""A shared scenario's run on JAX compared with its run on TensorFlow.

Keras chooses its backend once per process, at import. The JAX pytest
process (`engines/jax/test_jax_scenarios.py`) runs every scenario whose
`backends` name JAX (`jax_scenarios`) with the Python runner
(`scenario_runner.PythonRun`), and starts one process on TensorFlow
(`TensorFlowRuns`: this module run with `python -m`) that runs the same
scenarios with the same runner. That process writes each scenario's record
as one JSON line as soon as the scenario ends, so the two backends run side
by side; `compare_backends` then compares the records.

Example (in a process on JAX):
>>> runs = TensorFlowRuns(["cnn_count2"], tmp_path)
>>> jax_record = PythonRun(scenario, tmp_path / "jax").execute()
>>> largest, compared = compare_backends(runs.record("cnn_count2"), jax_record)
>>> runs.close()
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

from support.scenario_files import SCENARIOS, backends
from support.scenario_parity import compare_numbers

# Largest allowed difference between a scenario's TensorFlow and JAX runs:
# weights and predictions absolute, losses and metrics relative above 1
# (`scenario_parity.compare_numbers`), as the JAX engine's own tests.
BACKEND_TOLERANCE = 1e-5
# The logical CPU devices of the TensorFlow process, as the test set-up
# gives every pytest process (tests/python/conftest.py).
NUM_DEVICES = 4
# Bounds a wedged TensorFlow process: how long it may go without writing a
# record, far above a normal scenario's run (about 30 s; minutes on a
# loaded CI machine, where the process runs at nice 10), far below "hangs
# forever". It runs the scenarios one after another, so the deadline
# counts from its last record, not from its start.
RUN_TIMEOUT = 600
TESTS_PYTHON = pathlib.Path(__file__).resolve().parents[1]


def jax_scenarios():
    """The shared scenarios whose `backends` name JAX, in file order."""
    return [s for s in SCENARIOS if "jax" in backends(s)]


def to_json(record):
    """A scenario record as one line of JSON; arrays as `{"array", "shape"}`."""

    def encode(value):
        if isinstance(value, np.ndarray | np.generic):
            array = np.asarray(value, dtype="float64")
            return {"array": array.ravel().tolist(), "shape": list(array.shape)}
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    return json.dumps(record, default=encode)


def from_json(line):
    """The record `to_json` wrote, its arrays float64 numpy arrays again."""

    def decode(value):
        if set(value) == {"array", "shape"}:
            return np.asarray(value["array"], dtype="float64").reshape(value["shape"])
        return value

    return json.loads(line, object_hook=decode)


class TensorFlowRuns:
    """One process on TensorFlow running scenarios with the Python runner.

    Args:
        names: The scenarios to run, in order.
        workdir: A directory for the records and the files the runs save.
    """

    def __init__(self, names, workdir):
        self.workdir = pathlib.Path(workdir)
        self.output = self.workdir / "tensorflow-records.jsonl"
        self.log = open(self.workdir / "tensorflow-log.txt", "w+")
        env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS_PYTHON), env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "support.scenario_backends", str(self.output),
             str(self.workdir), *names],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.progressed = time.monotonic()
        self.records = {}

    def record(self, name):
        """The TensorFlow record of scenario `name`, waiting for it if need be.

        Raises:
            AssertionError: if the TensorFlow run of `name` failed, or the
                process ended or ran out of time without writing it.
        """
        while name not in self.records:
            self._read()
            if name in self.records:
                break
            if self.process.poll() is not None:
                self._read()
                assert name in self.records, (
                    f"the TensorFlow process ended (exit {self.process.returncode}) "
                    f"without a record of {name}:\n{self._log_tail()}")
            assert time.monotonic() - self.progressed < RUN_TIMEOUT, (
                f"no TensorFlow record of {name}, nor of any other scenario, "
                f"for {RUN_TIMEOUT} s:\n{self._log_tail()}")
            time.sleep(0.2)
        record = self.records[name]
        assert "failure" not in record, (
            f"the TensorFlow run of {name} failed:\n{record['failure']}")
        return record

    def _read(self):
        if not self.output.exists():
            return
        # A line is whole once its newline is written.
        for line in self.output.read_text().split("\n")[:-1]:
            entry = from_json(line)
            if entry["name"] not in self.records:
                self.records[entry["name"]] = entry["record"]
                self.progressed = time.monotonic()

    def _log_tail(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def close(self):
        """Ends the process if it still runs, and closes its log."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.log.close()


def compare_backends(tensorflow, jax):
    """Compares a scenario's JAX record with its TensorFlow record.

    The same error (class, message, and its R rendering) or none, and the
    same numbers (`scenario_parity.compare_numbers`), but for the losses of
    each output of a multi-output model, which Keras itself reports
    otherwise on the two backends (`per_output_losses`): on JAX they must
    add up to the total loss instead.

    Returns:
        The largest difference and how many numbers were compared.
    """
    assert (tensorflow["error"] is None) == (jax["error"] is None), (
        f"TensorFlow error: {tensorflow['error']}; JAX error: {jax['error']}")
    if tensorflow["error"] is not None:
        for key in ("class", "message", "message_r"):
            assert jax["error"][key] == tensorflow["error"][key], (
                f"{key} on JAX: {jax['error'][key]!r}; on TensorFlow: "
                f"{tensorflow['error'][key]!r}")
    for step in jax["steps"]:
        for key in ("history", "metrics"):
            if key in step:
                check_loss_adds_up(step[key])
    return compare_numbers(without_per_output_losses(tensorflow),
                           without_per_output_losses(jax))


# Keras 3.15 weighs each batch's loss of one output (`<output>_loss` of a
# multi-output model, in histories and evaluate results) by the batch's
# rows as the output's static shape gives them (`CompileLoss.call`,
# https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/compile_utils.py):
# known when JAX traces a step, unknown (None) in a TensorFlow graph, where
# each batch then counts once, whatever its rows. With a short last batch
# the two backends report other per-output losses for the same model on one
# device (`siamese_outputs`, first epoch: `add_loss` 1.379 on TensorFlow,
# 1.624 on JAX), while the total loss, which both weigh by rows, agrees.


def per_output_losses(values):
    """The names of per-output losses among a history's or evaluate's names."""
    return [name for name in values
            if name.endswith("_loss") and name not in ("loss", "val_loss")]


def check_loss_adds_up(values):
    """Asserts that per-output losses, means over rows, add up to the loss.

    So they do when the loss has no other terms (the recipes' models have
    no regularization losses) and no loss weights.

    Args:
        values: A history (name to a list, one per epoch) or evaluate's
            results (name to a number).
    """
    for prefix in ("", "val_"):
        parts = [n for n in per_output_losses(values)
                 if n.startswith(prefix) and (prefix or not n.startswith("val_"))]
        if not parts:
            continue
        total = np.atleast_1d(np.asarray(values[prefix + "loss"], "float64"))
        summed = sum(np.atleast_1d(np.asarray(values[n], "float64")) for n in parts)
        assert np.all(np.abs(summed - total) <= BACKEND_TOLERANCE * np.maximum(
            1.0, np.abs(total))), (f"{prefix}loss {total} is not the sum of "
                                   f"{parts}: {summed}")


def without_per_output_losses(record):
    """`record` with its per-output losses left out (`per_output_losses`)."""
    steps = []
    for step in record["steps"]:
        step = dict(step)
        for key in ("history", "metrics"):
            if key in step:
                leave = set(per_output_losses(step[key]))
                step[key] = {k: v for k, v in step[key].items() if k not in leave}
        steps.append(step)
    return dict(record, steps=steps)


def main(output, workdir, names):
    """Runs `names` on TensorFlow, appending each record to `output`."""
    import multigpu

    multigpu.virtual_devices(NUM_DEVICES)
    from support.scenario_runner import PythonRun

    warnings.simplefilter("ignore", UserWarning)
    by_name = {s["name"]: s for s in SCENARIOS}
    with open(output, "a") as handle:
        for name in names:
            try:
                record = PythonRun(by_name[name], tempfile.mkdtemp(dir=workdir),
                                   pooled_batch_norm=True).execute()
                entry = {"name": name, "record": record}
            except Exception:  # noqa: BLE001 - reported to the JAX process
                entry = {"name": name, "record": {"failure": traceback.format_exc()}}
            handle.write(to_json(entry) + "\n")
            handle.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
