"""Exact resume: stopped at seeded-random moments, a run ends like an unbroken one.

Every training path (multi_gpu_model, model.fit under a mirrored strategy,
fit_distributed, and multi_gpu_model on JAX) and both checkpoint frequencies (batches, epochs) are
stopped twice: first killed with SIGKILL inside a checkpoint file write,
then, with batch checkpoints, killed right after a training step, and with
epoch checkpoints sent SIGUSR1 (a scheduler's warning before its time
limit: the callbacks save after the batch in progress and exit with status
75); the restarted runs must end with the weights of an uninterrupted run
to 1e-6. The model has dropout and the data is shuffled
(seeded), so the random state and the data order must be restored too.
"""

import concurrent.futures
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from multigpu.checkpoints.preemption import PREEMPTED_EXIT_STATUS
from support.worker_scripts import WORKERS

WORKER = os.path.join(WORKERS, "resume_exact.py")
PATHS = ("multi_gpu_model", "mirrored", "fit_distributed", "jax")
FREQUENCIES = ("2", "epoch")
RUN_TIMEOUT = 300
SEED = 15


def _environment(path):
    """The worker's environment: the "jax" path runs on Keras's JAX backend."""
    return dict(os.environ,
                KERAS_BACKEND="jax" if path == "jax" else "tensorflow")


def _run(path, save_freq, checkpoint_dir, out, *kill):
    result = subprocess.run(
        [sys.executable, WORKER, path, save_freq, str(checkpoint_dir),
         str(out), *kill],
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
        env=_environment(path),
    )
    return result.returncode, result.stderr


def _kill_plan(rng, save_freq):
    """Two stops per scenario: inside a checkpoint write, then after a step.

    The first dies in the n-th file commit of its run (n <= 8: always within
    the first two of the three epochs); the second stops right after step s
    of 18, which lies beyond where the first kill left training: SIGKILL
    with batch checkpoints, SIGUSR1 with epoch checkpoints (the state is
    then saved mid-epoch, where none would be otherwise).
    """
    second = "--kill-step" if save_freq.isdigit() else "--signal-step"
    return (("--kill-write", str(rng.integers(1, 9))),
            (second, str(rng.integers(13, 17))))


def _scenario(tmp_path, path, save_freq, plan):
    directory = tmp_path / f"{path}-{save_freq}"
    out = tmp_path / f"{path}-{save_freq}.npz"
    for kill in plan:
        code, stderr = _run(path, save_freq, directory, out, *kill)
        if kill[0] == "--signal-step":
            assert code == PREEMPTED_EXIT_STATUS, (kill, stderr[-2000:])
            assert "caught SIGUSR1; saved the training state after batch" \
                in stderr and "Run the same script again" in stderr, stderr[-2000:]
        else:
            assert code == -signal.SIGKILL, (kill, stderr[-2000:])
    code, stderr = _run(path, save_freq, directory, out)
    assert code == 0, stderr[-2000:]
    # Resumed from the backup itself, not from a fallback.
    assert "skipping the unreadable" not in stderr, stderr[-2000:]
    return out


# One test per training path and checkpoint frequency, so that parallel
# test workers share them out. The gate stops the first path with epoch
# checkpoints (SIGKILL inside a file write, then SIGUSR1 mid-epoch); batch
# checkpoints and the other paths are the full tier's (test_checkpoints.py
# SIGKILLs a run mid-epoch in the gate).
@pytest.mark.parametrize("path, save_freq", [
    pytest.param(path, freq, marks=() if (path, freq) == (PATHS[0], "epoch")
                 else pytest.mark.full)
    for path in PATHS for freq in FREQUENCIES])
def test_killed_anywhere_twice_resumes_to_the_uninterrupted_weights(
        tmp_path, path, save_freq):
    rng = np.random.default_rng([SEED, PATHS.index(path)])
    plan = {freq: _kill_plan(rng, freq) for freq in FREQUENCIES}[save_freq]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        unbroken = pool.submit(_run, path, "epoch", tmp_path / "unbroken",
                               tmp_path / "unbroken.npz")
        resumed = _scenario(tmp_path, path, save_freq, plan)
        code, stderr = unbroken.result()
    assert code == 0, stderr[-2000:]
    want, got = np.load(tmp_path / "unbroken.npz"), np.load(resumed)
    for key in want:
        np.testing.assert_allclose(
            got[key], want[key], atol=1e-6, rtol=0,
            err_msg=f"{path}, save_freq={save_freq}, kills {plan}")


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("save_freq", ["1", "3", "epoch"])
def test_soak_killed_at_random_times_from_outside(tmp_path, path, save_freq):
    """SIGKILLs from outside at seeded random times until a run finishes."""
    rng = np.random.default_rng(hash((SEED, path, save_freq)) % 2**32)
    code, stderr = _run(path, "epoch", tmp_path / "unbroken",
                        tmp_path / "unbroken.npz")
    assert code == 0, stderr[-2000:]
    out, kills = tmp_path / "resumed.npz", 0
    while True:
        process = subprocess.Popen(
            [sys.executable, WORKER, path, save_freq, str(tmp_path / "ckpt"),
             str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=_environment(path))
        try:
            # Up to 15 kills, then the run may finish (a loaded machine
            # could otherwise never reach the next checkpoint).
            process.wait(timeout=float(rng.uniform(4.0, 12.0))
                         if kills < 15 else RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            kills += 1
            continue
        assert process.returncode == 0
        break
    got, want = np.load(out), np.load(tmp_path / "unbroken.npz")
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-6, rtol=0,
                                   err_msg=f"after {kills} kills")
