"""`python -m multigpu.launch --workers N -- COMMAND`: any program per worker.

The commands here are shell one-liners (no TensorFlow), run through the
command line's `main()` in this process; the R tests
(tests/testthat/test-strategy.R) launch `Rscript` workers that train.
"""

import json
import time
from types import SimpleNamespace

import pytest

from multigpu import launch


@pytest.fixture
def run(capfd):
    """Runs the launcher's command line; returns code, stdout, stderr."""
    def run_main(*args):
        capfd.readouterr()
        code = launch.main(list(args))
        out, err = capfd.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return run_main


def test_a_command_after_the_separator_runs_once_per_worker(run):
    result = run("--workers", "2", "--startup-timeout", "0", "--",
                     "sh", "-c", 'echo "args $0 $1"; echo "TF_CONFIG=$TF_CONFIG"',
                     "first", "--second")
    assert result.returncode == 0, result.stderr
    configs = {}
    for line in result.stdout.splitlines():
        prefix, _, rest = line.partition("] ")
        if rest.startswith("TF_CONFIG="):
            configs[prefix + "]"] = json.loads(rest[len("TF_CONFIG="):])
        else:
            assert rest == "args first --second"
    assert sorted(configs) == ["[worker 0]", "[worker 1]"]
    assert [configs[f"[worker {i}]"]["task"]["index"] for i in range(2)] == [
        0, 1]


def test_a_failing_command_stops_every_worker_fast(run):
    start = time.monotonic()
    result = run(
        "--workers", "2", "--startup-timeout", "0", "--", "sh", "-c",
        'case "$TF_CONFIG" in *\'"index": 1\'*) echo dying; exit 5;; esac; '
        "sleep 300")
    assert result.returncode == 5
    assert "worker 1 exited with code 5" in result.stderr
    assert "[worker 1] dying" in result.stdout
    assert time.monotonic() - start < 60  # not after worker 0's sleep


def test_a_command_that_never_joins_is_stopped_at_the_startup_deadline(run):
    result = run("--workers", "2", "--startup-timeout", "2", "--",
                     "sleep", "300")
    assert result.returncode == 124
    assert "did not join the cluster within 2 s" in result.stderr


def test_an_unknown_program_is_named(capsys):
    assert launch.main(["--workers", "2", "--", "Rscriptt", "x.R"]) == 2
    assert "'Rscriptt' is not a program on PATH" in capsys.readouterr().err


def test_nothing_to_run_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as raised:
        launch.main(["--workers", "2"])
    assert raised.value.code == 2
    assert "-- and a command" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"`command`: received \[\]"):
        launch.launch_command([], workers=2)
