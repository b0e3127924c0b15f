"""multigpu.launch: the launcher that starts workers on localhost, gives each
its TF_CONFIG, prefixes their output, and stops them all when one fails,
stops or never joins. (The training the workers do is in
test_distributed.py.)"""

import json
import subprocess
import sys
import time

import pytest

from multigpu import launch
from support.worker_scripts import RUN_TIMEOUT, running, script

PYTHON = sys.executable


def test_cli_gives_each_worker_its_tf_config_and_prefixes_output():
    result = subprocess.run(
        [PYTHON, "-m", "multigpu.launch", "--workers", "3",
         "--startup-timeout", "0", script("echo_config.py")],
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    configs = {}
    for line in result.stdout.splitlines():
        if "TF_CONFIG=" in line:
            prefix, config = line.split("TF_CONFIG=", 1)
            configs[prefix.strip()] = json.loads(config)
    assert sorted(configs) == ["[worker 0]", "[worker 1]", "[worker 2]"]
    clusters = {tuple(c["cluster"]["worker"]) for c in configs.values()}
    assert len(clusters) == 1
    addresses = clusters.pop()
    assert len(set(addresses)) == 3
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    for index in range(3):
        assert configs[f"[worker {index}]"]["task"] == {
            "type": "worker", "index": index}
    assert result.stdout.count("message to stderr") == 3


def test_a_dead_worker_stops_the_run_fast_with_its_name_and_code(capfd):
    start = time.monotonic()
    with pytest.raises(launch.LaunchError) as raised:
        launch.launch(script("mw_crash.py"), workers=2, startup_timeout=120,
                      timeout=RUN_TIMEOUT)
    elapsed = time.monotonic() - start
    message = str(raised.value)
    assert "worker 1 exited with code 3" in message
    assert "SIGKILL" in message
    assert raised.value.exit_status == 3
    assert elapsed < RUN_TIMEOUT  # failed fast, not at the run deadline
    assert "[worker 1] worker 1 fails now" in capfd.readouterr().out
    assert running("mw_crash.py") == []


# A deadline that runs out: the full tier's (the gate sees dead and
# stopped workers named, below and above).
@pytest.mark.full
def test_a_worker_that_never_joins_is_killed_at_the_startup_deadline():
    start = time.monotonic()
    result = subprocess.run(
        [PYTHON, "-m", "multigpu.launch", "--workers", "2",
         "--startup-timeout", "8", script("mw_no_peer.py")],
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 124
    assert "did not join the cluster within 8 s" in result.stderr
    assert "1]" in result.stderr.split("did not join")[0]
    assert "[worker 1] worker 1 hangs before joining" in result.stdout
    assert "joined a cluster that cannot exist" not in result.stdout
    assert elapsed < RUN_TIMEOUT
    assert running("mw_no_peer.py") == []


def test_cli_reports_a_missing_script(capsys):
    assert launch.main(["--workers", "2", "nope.py"]) == 2
    assert "Invalid `script`: received 'nope.py'" in capsys.readouterr().err


def test_launch_rejects_invalid_worker_counts():
    with pytest.raises(ValueError, match=r"`workers`: received 0"):
        launch.launch(script("echo_config.py"), workers=0)


def test_tf_config_and_free_ports():
    ports = launch.free_ports(4)
    assert len(set(ports)) == 4
    config = json.loads(launch.tf_config(["a:1", "b:2"], 1))
    assert config == {"cluster": {"worker": ["a:1", "b:2"]},
                      "task": {"type": "worker", "index": 1}}


def test_a_stopped_worker_is_named_and_all_are_killed(capfd):
    with pytest.raises(launch.LaunchError,
                       match=r"worker 1 has been stopped \(SIGSTOP"):
        launch.launch(script("mw_stop.py"), workers=2, startup_timeout=120,
                      timeout=RUN_TIMEOUT, stopped_timeout=3)
    assert "[worker 1] worker 1 stops now" in capfd.readouterr().out
    assert running("mw_stop.py") == []


@pytest.mark.full  # a fault in depth: the gate stops a worker just above
def test_a_failure_while_a_worker_is_stopped_names_the_stopped_one():
    with pytest.raises(launch.LaunchError) as raised:
        launch.launch(script("mw_stop.py"), ["peer-fails"], workers=2,
                      startup_timeout=120, timeout=RUN_TIMEOUT)
    message = str(raised.value)
    assert "worker 0 exited with code 5" in message
    assert "Worker 1 has been stopped (SIGSTOP or SIGTSTP)" in message
    assert "likely cause" in message
    assert running("mw_stop.py") == []


@pytest.mark.parametrize("option", ["--startup-timeout", "--timeout"])
def test_cli_rejects_negative_timeouts(capsys, option):
    assert launch.main(["--workers", "2", option, "-5",
                        script("echo_config.py")]) == 2
    assert f"`{option[2:].replace('-', '_')}`: received -5.0" in \
        capsys.readouterr().err
