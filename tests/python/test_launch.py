"""multigpu.launch and multi-worker training (fit_distributed) on localhost."""

import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from models import mlp
from multigpu import launch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
PYTHON = sys.executable
# Bounds a wedged run: far above a normal run, far below "hangs forever".
RUN_TIMEOUT = 180


def _script(name):
    return os.path.join(WORKERS, name)


def _running_scripts(name):
    """Pids of live processes running the worker script `name`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if _script(name).encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def test_cli_gives_each_worker_its_tf_config_and_prefixes_output():
    result = subprocess.run(
        [PYTHON, "-m", "multigpu.launch", "--workers", "3",
         "--startup-timeout", "0", _script("echo_config.py")],
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


def test_two_workers_train_like_one_process_on_the_same_global_batches(
        tmp_path, capfd):
    assert launch.launch(_script("mw_fit.py"), [str(tmp_path)], workers=2,
                         startup_timeout=120, timeout=RUN_TIMEOUT) == 0
    output = capfd.readouterr().out
    assert "[worker 0] worker 0 done" in output
    assert "[worker 1] worker 1 done" in output
    runs = [json.loads((tmp_path / f"run-{i}.json").read_text())
            for i in range(2)]
    weights = [np.load(tmp_path / f"weights-{i}.npz") for i in range(2)]
    assert runs[0]["replicas"] == 2
    for key in weights[0]:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])
    assert runs[0]["history"] == runs[1]["history"]

    reference = mlp()
    reference.set_weights([np.asarray(w, "float32")
                           for w in runs[0]["initial"]])
    reference.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss="mse", metrics=["mae"])
    sys.path.insert(0, WORKERS)
    try:
        import _common
    finally:
        sys.path.remove(WORKERS)
    x, y = _common.training_data()
    expected = reference.fit(x, y, batch_size=runs[0]["global_batch"],
                             epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(runs[0]["history"]["loss"],
                               expected.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(runs[0]["history"]["mae"],
                               expected.history["mae"], rtol=1e-5)
    for got, want in zip(weights[0].values(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_dead_worker_stops_the_run_fast_with_its_name_and_code(capfd):
    start = time.monotonic()
    with pytest.raises(launch.LaunchError) as raised:
        launch.launch(_script("mw_crash.py"), workers=2, startup_timeout=120,
                      timeout=RUN_TIMEOUT)
    elapsed = time.monotonic() - start
    message = str(raised.value)
    assert "worker 1 exited with code 3" in message
    assert "SIGKILL" in message
    assert raised.value.exit_status == 3
    assert elapsed < RUN_TIMEOUT  # failed fast, not at the run deadline
    assert "[worker 1] worker 1 fails now" in capfd.readouterr().out
    assert _running_scripts("mw_crash.py") == []


def test_a_worker_that_never_joins_is_killed_at_the_startup_deadline():
    start = time.monotonic()
    result = subprocess.run(
        [PYTHON, "-m", "multigpu.launch", "--workers", "2",
         "--startup-timeout", "8", _script("mw_no_peer.py")],
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 124
    assert "did not join the cluster within 8 s" in result.stderr
    assert "1]" in result.stderr.split("did not join")[0]
    assert "[worker 1] worker 1 hangs before joining" in result.stdout
    assert "joined a cluster that cannot exist" not in result.stdout
    assert elapsed < RUN_TIMEOUT
    assert _running_scripts("mw_no_peer.py") == []


def test_cli_reports_a_missing_script(capsys):
    assert launch.main(["--workers", "2", "nope.py"]) == 2
    assert "Invalid `script`: received 'nope.py'" in capsys.readouterr().err


def test_launch_rejects_invalid_worker_counts():
    with pytest.raises(ValueError, match=r"`workers`: received 0"):
        launch.launch(_script("echo_config.py"), workers=0)


def test_tf_config_and_free_ports():
    ports = launch.free_ports(4)
    assert len(set(ports)) == 4
    config = json.loads(launch.tf_config(["a:1", "b:2"], 1))
    assert config == {"cluster": {"worker": ["a:1", "b:2"]},
                      "task": {"type": "worker", "index": 1}}


def test_multi_worker_strategy_rejects_a_malformed_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    with pytest.raises(ValueError, match="Invalid TF_CONFIG"):
        multigpu.multi_worker_strategy()
    monkeypatch.setenv("TF_CONFIG", "not json")
    with pytest.raises(ValueError, match="multigpu.launch"):
        multigpu.multi_worker_strategy()


def _compiled_under(strategy):
    with strategy.scope():
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss="mse", metrics=["mae"])
    return model


def test_fit_distributed_under_a_mirrored_strategy_matches_fit(rng):
    strategy = multigpu.mirrored_strategy(2)
    model = _compiled_under(strategy)
    reference = mlp()
    reference.set_weights(model.get_weights())
    reference.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss="mse", metrics=["mae"])
    x, y = np.asarray(rng.standard_normal((64, 8)), "float32"), np.asarray(
        rng.standard_normal((64, 3)), "float32")
    history = multigpu.fit_distributed(
        model, multigpu.distributed_dataset(x, y, 8, strategy=strategy),
        epochs=2, verbose=0)
    assert isinstance(history, keras.callbacks.History)
    want = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                         verbose=0)
    np.testing.assert_allclose(history.history["loss"],
                               want.history["loss"], rtol=1e-5)
    for got, expected in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_fit_distributed_resumes_with_checkpoint_callbacks(rng, tmp_path):
    strategy = multigpu.mirrored_strategy(2)
    x, y = np.asarray(rng.standard_normal((32, 8)), "float32"), np.asarray(
        rng.standard_normal((32, 3)), "float32")
    batches = multigpu.distributed_dataset(x, y, 8, strategy=strategy)
    model = _compiled_under(strategy)
    multigpu.fit_distributed(model, batches, epochs=2, verbose=0,
                             callbacks=multigpu.checkpoint_callbacks(tmp_path))
    epochs = []
    restarted = _compiled_under(strategy)
    history = multigpu.fit_distributed(
        restarted, batches, epochs=3, verbose=0,
        callbacks=multigpu.checkpoint_callbacks(tmp_path) + [
            keras.callbacks.LambdaCallback(
                on_epoch_begin=lambda epoch, logs: epochs.append(epoch))])
    assert epochs == [2]
    assert len(history.history["loss"]) == 1


def test_fit_distributed_rejects_misuse_with_the_fix(rng):
    strategy = multigpu.mirrored_strategy(2)
    x, y = np.zeros((8, 8), "float32"), np.zeros((8, 3), "float32")
    batches = multigpu.distributed_dataset(x, y, 4, strategy=strategy)
    outside = mlp()
    outside.compile(optimizer="sgd", loss="mse")
    with pytest.raises(multigpu.StrategyUsageError,
                       match=r"not created under the scope"):
        multigpu.fit_distributed(outside, batches, strategy=strategy)
    with pytest.raises(ValueError, match=r"is not compiled"):
        multigpu.fit_distributed(mlp(), batches)
    with pytest.raises(TypeError, match=r"`dataset`.*distributed_dataset"):
        multigpu.fit_distributed(_compiled_under(strategy), x)
    with pytest.raises(ValueError, match=r"`epochs`: received -1"):
        multigpu.fit_distributed(_compiled_under(strategy), batches, epochs=-1)


def test_multi_worker_checkpoints_finish_and_resume_after_a_worker_dies(
        tmp_path, capfd):
    """The chief writes the checkpoints; a killed run resumes from them."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    with pytest.raises(launch.LaunchError, match="worker 1 was killed by SIGKILL"):
        launch.launch(_script("mw_checkpoints.py"),
                      [str(ckpt), str(out), "--kill-worker", "1",
                       "--at-step", "11"],
                      workers=2, startup_timeout=120, timeout=RUN_TIMEOUT)
    names = sorted(os.listdir(ckpt))
    assert "ckpt-2-2.keras" in names, names
    assert not [n for n in names if n.startswith(".tmp")]
    assert launch.launch(_script("mw_checkpoints.py"), [str(ckpt), str(out)],
                         workers=2, startup_timeout=120,
                         timeout=RUN_TIMEOUT) == 0
    output = capfd.readouterr().out
    assert "[worker 0] worker 0 done" in output
    assert "[worker 1] worker 1 done" in output
    weights = [np.load(out / f"weights-{i}.npz") for i in range(2)]
    for key in weights[0]:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])
    assert not [n for n in os.listdir(ckpt) if n.startswith(".tmp")]


def test_a_stopped_worker_is_named_and_all_are_killed(capfd):
    with pytest.raises(launch.LaunchError,
                       match=r"worker 1 has been stopped \(SIGSTOP"):
        launch.launch(_script("mw_stop.py"), workers=2, startup_timeout=120,
                      timeout=RUN_TIMEOUT, stopped_timeout=3)
    assert "[worker 1] worker 1 stops now" in capfd.readouterr().out
    assert _running_scripts("mw_stop.py") == []


def test_a_failure_while_a_worker_is_stopped_names_the_stopped_one():
    with pytest.raises(launch.LaunchError) as raised:
        launch.launch(_script("mw_stop.py"), ["peer-fails"], workers=2,
                      startup_timeout=120, timeout=RUN_TIMEOUT)
    message = str(raised.value)
    assert "worker 0 exited with code 5" in message
    assert "Worker 1 has been stopped (SIGSTOP or SIGTSTP)" in message
    assert "likely cause" in message
    assert _running_scripts("mw_stop.py") == []


@pytest.mark.parametrize("option", ["--startup-timeout", "--timeout"])
def test_cli_rejects_negative_timeouts(capsys, option):
    assert launch.main(["--workers", "2", option, "-5",
                        _script("echo_config.py")]) == 2
    assert f"`{option[2:].replace('-', '_')}`: received -5.0" in \
        capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("save_freq", ["1", "epoch"])
def test_multi_worker_resume_ends_like_an_uninterrupted_run(tmp_path,
                                                            save_freq):
    """Killing worker 0 (the chief) or worker 1 changes no final weight."""
    runs = {}
    for name, kills in (("unbroken", []),
                        ("killed", [("1", "5"), ("0", "11")])):
        ckpt, out = tmp_path / f"{name}-ckpt", tmp_path / name
        out.mkdir()
        for worker, step in kills:
            with pytest.raises(launch.LaunchError, match="SIGKILL"):
                launch.launch(_script("mw_checkpoints.py"),
                              [str(ckpt), str(out), "--save-freq", save_freq,
                               "--kill-worker", worker, "--at-step", step],
                              workers=2, timeout=RUN_TIMEOUT)
        assert launch.launch(_script("mw_checkpoints.py"),
                             [str(ckpt), str(out), "--save-freq", save_freq],
                             workers=2, timeout=RUN_TIMEOUT) == 0
        runs[name] = np.load(out / "weights-1.npz")
    for key in runs["unbroken"]:
        np.testing.assert_allclose(runs["killed"][key], runs["unbroken"][key],
                                   atol=1e-6, rtol=0)


def test_fit_distributed_refuses_data_without_batches():
    strategy = multigpu.mirrored_strategy(2)
    rows = (np.zeros((0, 8), "float32"), np.zeros((0, 3), "float32"))
    empty = tf.data.Dataset.from_tensor_slices(rows).batch(4)
    with pytest.raises(ValueError, match=r"`dataset`: it is empty"):
        multigpu.fit_distributed(_compiled_under(strategy), empty, verbose=0)
    unknown = tf.data.Dataset.from_tensor_slices(rows).filter(
        lambda x, y: True).batch(4)
    with pytest.raises(ValueError, match=r"yielded no batch in epoch 0"):
        multigpu.fit_distributed(_compiled_under(strategy), unknown,
                                 verbose=0)
