"""JAX across processes: workers started by the launcher train as one process.

Each worker runs `support/workers/jax_processes.py`, the script one machine
runs: two logical CPU devices of its own, `multi_gpu_model(model,
gpus=None)` over every worker's devices, the same data. The weights,
losses and predictions of every worker must equal one process training
the same model on as many devices (this pytest process's four), on
batches that split evenly, unevenly and leave devices without rows; under
the launcher and under Slurm's `srun -n 2` alike.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from multigpu import launch
from multigpu.checkpoints.listing import list_checkpoints
from support.slurm import python_path_env
from support.worker_scripts import RUN_TIMEOUT, WORKERS, script

sys.path.insert(0, WORKERS)
from jax_processes_model import fit_and_predict, resumable_fit

TOL = 1e-5


@pytest.fixture(scope="module")
def one_process():
    """The run on this process's 4 devices, which every worker must equal."""
    weights, losses, predictions = fit_and_predict(gpus=4)
    return weights, np.asarray(losses), predictions


def _results(out, index):
    with np.load(f"{out}-{index}.npz") as saved:
        weights = [saved[f"arr_{i}"] for i in range(len(saved.files) - 2)]
        return weights, saved["history"], saved["predictions"]


def _assert_trained_as_one_process(out, printed, one_process):
    for index in (0, 1):
        # Joined: each sees the job's 4 devices, 2 of them its own.
        assert f"process {index} of 2, devices 4 (2 here)" in printed
    weights, losses, predictions = one_process
    for index in (0, 1):
        got_weights, got_losses, got_predictions = _results(out, index)
        assert len(got_weights) == len(weights)
        for got, want in zip(got_weights, weights, strict=True):
            np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        np.testing.assert_allclose(got_losses, losses, atol=TOL, rtol=0)
        np.testing.assert_allclose(got_predictions, predictions, atol=TOL, rtol=0)


def test_two_workers_of_the_launcher_train_as_one_process_on_every_batch_shape(
        tmp_path, one_process, capfd):
    out = str(tmp_path / "run")
    assert launch.launch(script("jax_processes.py"), [out], workers=2,
                         startup_timeout=RUN_TIMEOUT, timeout=RUN_TIMEOUT) == 0
    _assert_trained_as_one_process(out, capfd.readouterr().out, one_process)


def test_two_tasks_of_a_slurm_step_train_as_one_process(slurm, tmp_path, one_process):
    out = str(tmp_path / "run")
    result = subprocess.run(
        ["srun", "-n2", "--kill-on-bad-exit=1", "--time=5", sys.executable, "-u",
         script("jax_processes.py"), out],
        env=dict(python_path_env(), KERAS_BACKEND="jax"), capture_output=True,
        text=True, timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_trained_as_one_process(out, result.stdout, one_process)


def test_workers_whose_batches_differ_stop_with_the_fix(tmp_path, capfd):
    with pytest.raises(launch.LaunchError) as raised:
        launch.launch(script("jax_processes.py"), [str(tmp_path / "run"),
                      "other-batches"], workers=2,
                      startup_timeout=RUN_TIMEOUT, timeout=RUN_TIMEOUT)
    assert raised.value.exit_status == 1
    out = capfd.readouterr().out
    assert "Process(es) [1] of this job hold another batch than process 0" in out
    assert "keras.utils.set_random_seed" in out
    assert not any(os.path.exists(tmp_path / f"run-{i}.npz") for i in (0, 1))


# Full tier: the launcher's handling of a dead worker runs in test_launch.py's gate tests.
@pytest.mark.full
def test_a_worker_that_dies_takes_the_other_down_with_its_name(tmp_path, capfd):
    with pytest.raises(launch.LaunchError) as raised:
        launch.launch(script("jax_processes.py"), [str(tmp_path / "run"), "dies"],
                      workers=2, startup_timeout=RUN_TIMEOUT, timeout=RUN_TIMEOUT)
    assert "worker 1 exited with code 3" in str(raised.value)
    assert raised.value.exit_status == 3
    assert "[worker 1] process 1 dies now" in capfd.readouterr().out
    assert not os.path.exists(tmp_path / "run-0.npz")


@pytest.fixture(scope="module")
def unbroken():
    """The weights of `resumable_fit` uninterrupted, on this process's 4 devices."""
    weights, _ = resumable_fit(4, 4)
    return weights


def _assert_both_end_on(out, weights):
    for index in (0, 1):
        with np.load(f"{out}-{index}.npz") as saved:
            got = [saved[f"arr_{i}"] for i in range(len(weights))]
        for got_weight, want in zip(got, weights, strict=True):
            np.testing.assert_allclose(got_weight, want, atol=TOL, rtol=0)


# Resuming across processes, after a second run and after the launcher's
# warning: the full tier's (the gate trains two workers and an srun step as
# one process, and stops a dead worker's peer).
@pytest.mark.full
def test_workers_checkpoint_once_and_a_second_run_resumes_to_the_unbroken_weights(
        tmp_path, capfd, unbroken):
    checkpoints, out = str(tmp_path / "checkpoints"), str(tmp_path / "run")
    for epochs in (2, 4):
        assert launch.launch(script("jax_processes.py"),
                             [out, "resume", checkpoints, str(epochs)], workers=2,
                             startup_timeout=RUN_TIMEOUT, timeout=RUN_TIMEOUT) == 0
    printed = capfd.readouterr().out
    assert printed.count("trained epochs [0, 1]") == 2
    assert printed.count("trained epochs [2, 3]") == 2
    # The newest checkpoint is the last epoch's.
    assert list_checkpoints(checkpoints)[0].endswith("ckpt-4.keras")
    _assert_both_end_on(out, unbroken)


@pytest.mark.full
def test_a_warning_to_the_launcher_stops_both_after_one_batch_and_the_rerun_ends_unbroken(
        tmp_path, unbroken):
    """SIGUSR1 to the launcher reaches both processes at slightly different
    moments; they agree after every batch, stop after the same one, process
    0 saves, both exit with 75; run again, they end on the unbroken run's
    weights."""
    checkpoints, out = str(tmp_path / "checkpoints"), str(tmp_path / "run")
    command = [sys.executable, "-m", "multigpu.launch", "--workers", "2",
               "--timeout", str(RUN_TIMEOUT), script("jax_processes.py"), out,
               "resume", checkpoints, "4"]
    stopped = subprocess.run(command + ["6"], capture_output=True, text=True,
                             timeout=RUN_TIMEOUT)
    assert stopped.returncode == 75, stopped.stdout + stopped.stderr
    said = [line for line in stopped.stdout.splitlines()
            if "checkpoint_callbacks: caught SIGUSR1" in line]
    assert len(said) == 2, stopped.stdout
    # Both stopped after the same batch of the same epoch.
    positions = {line.split("after ", 1)[1].split(" in ")[0] for line in said}
    assert len(positions) == 1, said
    assert not os.path.exists(f"{out}-0.npz")
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_both_end_on(out, unbroken)
