"""The local Slurm cluster the Slurm tests run jobs on (`.ci/slurm-up.sh`)."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _srun_works():
    try:
        result = subprocess.run(["srun", "-n2", "true"], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    return None if result.returncode == 0 else (
        f"srun -n2 true exited with {result.returncode}: "
        f"{result.stderr.strip()[-300:]}")


@pytest.fixture(scope="module")
def slurm():
    """A working `srun`; started with .ci/slurm-up.sh if needed.

    Skips, saying why, only where Slurm cannot start (not root, no
    apt-get); in CI (`CI` set) that fails instead.
    """
    if _srun_works() is None:
        return
    result = subprocess.run(["bash", os.path.join(ROOT, ".ci", "slurm-up.sh")],
                            capture_output=True, text=True, timeout=600)
    problem = _srun_works()
    if problem is None:
        return
    said = (result.stderr or result.stdout).strip()[-300:]
    reason = (f"Slurm cannot be started here: .ci/slurm-up.sh exited with "
              f"{result.returncode} ({said}); {problem}")
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run the Slurm tests)")
    pytest.skip(reason)


def python_path_env():
    """The environment of a job's tasks: this checkout's core importable."""
    python_dir = os.path.join(ROOT, "python")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [python_dir, os.environ.get("PYTHONPATH")])),
        TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
