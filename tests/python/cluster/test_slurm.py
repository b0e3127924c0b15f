"""Multi-worker training on a real Slurm cluster: `srun -n2` on this machine.

`.ci/slurm-up.sh` (run by `make test`, and by these tests when Slurm does
not answer) starts a single-node cluster from Debian's packages. The tests
skip only where it cannot start (not root, no apt-get), and fail in CI.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from support.slurm import python_path_env
from support.worker_scripts import one_process_reference, running, script

TRAIN = script("cluster_train.py")
# Bounds a wedged step: far above a normal run (~20 s), below "forever".
STEP_TIMEOUT = 240


def _env():
    return python_path_env()


def _srun(*args):
    """The srun command line of a 2-task step running cluster_train.py."""
    return ["srun", "-n2", "--kill-on-bad-exit=1", "--time=5",
            sys.executable, "-u", TRAIN, *map(str, args)]


def _runs(out_dir):
    runs = [json.loads((out_dir / f"run-{i}.json").read_text())
            for i in range(2)]
    weights = [list(np.load(out_dir / f"weights-{i}.npz").values())
               for i in range(2)]
    return runs, weights


def test_srun_two_tasks_train_as_one_cluster_like_one_process(slurm, tmp_path):
    result = subprocess.run(_srun(tmp_path, "--epochs", 3), env=_env(),
                            capture_output=True, text=True,
                            timeout=STEP_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "task 0 done" in result.stdout and "task 1 done" in result.stdout
    runs, weights = _runs(tmp_path)
    assert [r["replicas"] for r in runs] == [2, 2]
    assert runs[0]["initial"] == runs[1]["initial"]
    for first, second in zip(*weights):
        np.testing.assert_array_equal(first, second)
    reference, history = one_process_reference(
        runs[0]["initial"], runs[0]["global_batch"], 3)
    np.testing.assert_allclose(runs[0]["history"]["loss"],
                               history.history["loss"], rtol=1e-5)
    for got, want in zip(weights[0], reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)


def _assert_tasks_trained_as_one_process(runs, weights, epochs):
    """Both tasks hold the same weights, one process's on the same batches."""
    for first, second in zip(*weights):
        np.testing.assert_array_equal(first, second)
    reference, _ = one_process_reference(
        runs[0]["initial"], runs[0]["global_batch"], epochs)
    for got, want in zip(weights[0], reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)


def _train_until_killed(command, kill_at_epoch):
    """Runs the step; SIGKILLs task 1 when it begins `kill_at_epoch`.

    Returns (exit code of srun, seconds from the kill to srun's exit, output).
    """
    step = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, killed_at = [], None
    try:
        for line in step.stdout:
            lines.append(line)
            if line.startswith("task 1 pid ") and line.split()[-1] == str(
                    kill_at_epoch):
                os.kill(int(line.split()[3]), signal.SIGKILL)
                killed_at = time.monotonic()
                break
        assert killed_at is not None, "".join(lines)
        code = step.wait(timeout=STEP_TIMEOUT)
        lines.extend(step.stdout.read().splitlines(keepends=True))
        return code, time.monotonic() - killed_at, "".join(lines)
    finally:
        if step.poll() is None:
            step.kill()
            step.wait()


# The full tier's Slurm cases (make test-full): a killed task, and a job
# requeued by its time-limit warning (about 3 min of waiting on Slurm's
# clock). The gate runs an srun step here and one on JAX
# (engines/jax/test_jax_processes.py); the warning's handling is unit-tested
# in checkpoints/test_preemption.py.
@pytest.mark.full
def test_killing_one_task_ends_the_step_and_resubmitting_resumes(
        slurm, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    command = _srun(tmp_path, "--epochs", 4, "--checkpoints", checkpoints)
    code, seconds, output = _train_until_killed(command, kill_at_epoch=2)
    assert code != 0, output
    assert "task 1: Killed" in output, output
    # Slurm's KillWait (5 s here, 30 s by default) bounds the survivor.
    assert seconds < 60, output
    assert running("cluster_train.py") == []
    assert not (tmp_path / "run-0.json").exists()

    result = subprocess.run(command, env=_env(), capture_output=True,
                            text=True, timeout=STEP_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    runs, weights = _runs(tmp_path)
    # The chief (task 0) writes the checkpoints; task 1 only reads them.
    assert [run["writes_checkpoints"] for run in runs] == [True, False]
    for run in runs:
        # Resumed after the last completed epoch (1, or 0 when the kill came
        # while the chief was still writing epoch 1's), not from scratch.
        assert run["epochs_run"][0] in (1, 2), output + result.stdout
        assert run["epochs_run"][-1] == 3
    _assert_tasks_trained_as_one_process(runs, weights, epochs=4)


# A job that outlives its time limit: Slurm warns it with SIGUSR1 before the
# limit (here 3 min, warned 60 s before, which Slurm delivers to within
# about 30 s: 90 to 150 s after the start, time for a loaded machine to
# start Python or R and reach the callbacks); checkpoint_callbacks save
# after the batch in progress and requeue the job, which starts again once
# Slurm's requeue delay (`cred_expire` in slurm.conf) has passed and
# resumes. The first allocation is slowed (`--slow-until-requeued`, about
# 215 s of steps) so that it cannot finish in time.
REQUEUE_TIMEOUT = 900


def _sbatch(tmp_path, name, options, command):
    """Submits `command` as a batch job; returns its id and its log's path."""
    job_script = tmp_path / f"{name}.sh"
    job_script.write_text("#!/bin/bash\n" + command + "\n")
    log = tmp_path / f"{name}.log"
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--time=3", "--requeue",
         "--open-mode=append", f"--output={log}", *options, str(job_script)],
        env=_env(), capture_output=True, text=True, timeout=60, check=True)
    return submitted.stdout.strip().split(";")[0], log


def _wait_for_jobs(jobs):
    """Waits until Slurm no longer lists the jobs; returns their final states."""
    deadline = time.monotonic() + REQUEUE_TIMEOUT
    states = {}
    while time.monotonic() < deadline:
        for job_id in jobs:
            shown = subprocess.run(["scontrol", "show", "job", "-o", job_id],
                                   capture_output=True, text=True, timeout=60)
            fields = dict(part.split("=", 1) for part in shown.stdout.split()
                          if "=" in part)
            states[job_id] = (fields.get("JobState"), fields.get("Restarts"))
        if all(state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
               for state, _ in states.values()):
            return states
        time.sleep(5)
    for job_id in jobs:
        subprocess.run(["scancel", job_id], timeout=60, check=False)
    raise AssertionError(f"jobs still running after {REQUEUE_TIMEOUT} s: {states}")


def _single_task(tmp_path, name, path, backend):
    """The batch script's line that runs resume_exact.py as the batch shell."""
    return f"export KERAS_BACKEND={backend}\nexec " + subprocess.list2cmdline([
        sys.executable, "-u", script("resume_exact.py"), path, "epoch",
        str(tmp_path / f"{name}-ckpt"), str(tmp_path / f"{name}.npz"),
        "--slow-until-requeued", "12"])


def _unbroken(tmp_path, path, backend):
    """resume_exact.py's run outside Slurm, never stopped: its weights."""
    done = subprocess.run(
        [sys.executable, script("resume_exact.py"), path, "epoch",
         str(tmp_path / f"unbroken-{path}"), str(tmp_path / f"unbroken-{path}.npz")],
        env=dict(_env(), KERAS_BACKEND=backend), capture_output=True,
        text=True, timeout=REQUEUE_TIMEOUT)
    assert done.returncode == 0, done.stderr[-2000:]
    return np.load(tmp_path / f"unbroken-{path}.npz")


@pytest.mark.full
def test_a_job_warned_before_its_time_limit_requeues_itself_and_ends_on_unbroken_weights(
        slurm, tmp_path):
    # Two tasks of an srun step, each warned: `--signal=USR1@60`.
    cluster = subprocess.list2cmdline([
        "srun", "--kill-on-bad-exit=1", sys.executable, "-u", TRAIN,
        str(tmp_path), "--epochs", "4", "--checkpoints",
        str(tmp_path / "cluster-ckpt"), "--slow-until-requeued", "9"])
    jobs = {
        # One task, the script exec'd as the batch shell: `--signal=B:USR1@60`.
        "single": _sbatch(tmp_path, "single", ["--signal=B:USR1@60"],
                          _single_task(tmp_path, "single", "mirrored",
                                       "tensorflow")),
        "single_jax": _sbatch(tmp_path, "single_jax", ["--signal=B:USR1@60"],
                              _single_task(tmp_path, "single_jax", "jax",
                                           "jax")),
        "cluster": _sbatch(tmp_path, "cluster", ["-n2", "--signal=USR1@60"],
                           cluster),
    }
    # Meanwhile, the single-task scripts uninterrupted, outside Slurm.
    unbroken = {"single": _unbroken(tmp_path, "mirrored", "tensorflow"),
                "single_jax": _unbroken(tmp_path, "jax", "jax")}
    states = _wait_for_jobs([job_id for job_id, _ in jobs.values()])
    logs = {name: log.read_text() for name, (_, log) in jobs.items()}
    restarts = {}
    for name, (job_id, _) in jobs.items():
        state, restarts[name] = states[job_id][0], int(states[job_id][1])
        assert state == "COMPLETED", (name, logs[name][-3000:])
        # The first allocation cannot finish; a loaded machine may need a
        # third (the resumed run warned again): each warning saves once and
        # requeues once.
        assert restarts[name] >= 1, (name, logs[name][-3000:])
        assert logs[name].count("caught SIGUSR1; saved the training state "
                                "after batch") == restarts[name], logs[name][-3000:]
        assert logs[name].count(f"Requeued Slurm job {job_id}") == restarts[name], (
            logs[name][-3000:])
    # At each warning both tasks stopped after the same batch; the chief
    # alone saved and requeued.
    stops = re.findall(r"caught SIGUSR1; (saved|the chief worker saved) the "
                       r"training state (after batch \d+ of epoch \d+)",
                       logs["cluster"])
    by_batch = {}
    for who, where in stops:
        by_batch.setdefault(where, []).append(who)
    assert len(by_batch) == restarts["cluster"], stops
    assert all(sorted(who) == ["saved", "the chief worker saved"]
               for who in by_batch.values()), stops

    for name, want in unbroken.items():
        got = np.load(tmp_path / f"{name}.npz")
        for key in want:
            np.testing.assert_allclose(got[key], want[key], atol=1e-6, rtol=0,
                                       err_msg=name)
    runs, weights = _runs(tmp_path)
    assert [run["restarts"] for run in runs] == [restarts["cluster"]] * 2
    _assert_tasks_trained_as_one_process(runs, weights, epochs=4)
