"""multigpu.fit_distributed: training with `strategy.run()` under a mirrored
strategy, and multi-worker training on localhost (workers started by
multigpu.launch) that matches one process and resumes from checkpoints after
a worker dies."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from multigpu import launch
from support.models import mlp
from support.worker_scripts import RUN_TIMEOUT, one_process_reference, script


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


# Full tier: the gate trains two workers with fit_distributed under srun (cluster/test_slurm.py).
@pytest.mark.full
def test_two_workers_train_like_one_process_on_the_same_global_batches(
        tmp_path, capfd):
    assert launch.launch(script("mw_fit.py"), [str(tmp_path)], workers=2,
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

    reference, expected = one_process_reference(
        runs[0]["initial"], runs[0]["global_batch"], 3)
    np.testing.assert_allclose(runs[0]["history"]["loss"],
                               expected.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(runs[0]["history"]["mae"],
                               expected.history["mae"], rtol=1e-5)
    for got, want in zip(weights[0].values(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)


# A worker killed, and a warned launcher: process faults in depth, the full
# tier's (the gate trains two workers like one process, above).
@pytest.mark.full
def test_multi_worker_checkpoints_finish_and_resume_after_a_worker_dies(
        tmp_path, capfd):
    """The chief writes the checkpoints; a killed run resumes from them."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    with pytest.raises(launch.LaunchError, match="worker 1 was killed by SIGKILL"):
        launch.launch(script("mw_checkpoints.py"),
                      [str(ckpt), str(out), "--kill-worker", "1",
                       "--at-step", "11"],
                      workers=2, startup_timeout=120, timeout=RUN_TIMEOUT)
    names = sorted(os.listdir(ckpt))
    assert "ckpt-2-2.keras" in names, names
    assert not [n for n in names if n.startswith(".tmp")]
    assert launch.launch(script("mw_checkpoints.py"), [str(ckpt), str(out)],
                         workers=2, startup_timeout=120,
                         timeout=RUN_TIMEOUT) == 0
    output = capfd.readouterr().out
    assert "[worker 0] worker 0 done" in output
    assert "[worker 1] worker 1 done" in output
    weights = [np.load(out / f"weights-{i}.npz") for i in range(2)]
    for key in weights[0]:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])
    assert not [n for n in os.listdir(ckpt) if n.startswith(".tmp")]


@pytest.mark.full
def test_a_warning_to_the_launcher_stops_every_worker_after_the_same_batch(tmp_path):
    """SIGUSR1 to the launcher (Slurm's warning to a batch shell that exec'd
    it) reaches both workers: they stop after the same batch, the chief
    saves, all exit with 75; run again, both finish from there. (That such
    a stop resumes to an unbroken run's weights, two workers included, is
    tests/python/cluster/test_slurm.py's requeue test.)"""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "multigpu.launch", "--workers", "2",
               "--timeout", str(RUN_TIMEOUT), script("mw_checkpoints.py"),
               str(ckpt), str(out), "--save-freq", "epoch"]
    stopped = subprocess.run(command + ["--warn-launcher-at-step", "6"],
                             capture_output=True, text=True,
                             timeout=RUN_TIMEOUT)
    assert stopped.returncode == 75, stopped.stdout + stopped.stderr
    # Worker 0 warned after step 6 (epoch 2, batch 2); both stop after
    # batch 3 of epoch 2, and only the chief saved.
    assert ("[worker 0] checkpoint_callbacks: caught SIGUSR1; saved the "
            "training state after batch 3 of epoch 2" in stopped.stdout), stopped.stdout
    assert ("[worker 1] checkpoint_callbacks: caught SIGUSR1; the chief "
            "worker saved the training state after batch 3 of epoch 2"
            in stopped.stdout), stopped.stdout
    assert "run the same command again to resume" in stopped.stderr
    assert not list(out.iterdir())  # neither worker finished

    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    weights = [np.load(out / f"weights-{i}.npz") for i in range(2)]
    for key in weights[0]:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])


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
                launch.launch(script("mw_checkpoints.py"),
                              [str(ckpt), str(out), "--save-freq", save_freq,
                               "--kill-worker", worker, "--at-step", step],
                              workers=2, timeout=RUN_TIMEOUT)
        assert launch.launch(script("mw_checkpoints.py"),
                             [str(ckpt), str(out), "--save-freq", save_freq],
                             workers=2, timeout=RUN_TIMEOUT) == 0
        runs[name] = np.load(out / "weights-1.npz")
    for key in runs["unbroken"]:
        np.testing.assert_allclose(runs["killed"][key], runs["unbroken"][key],
                                   atol=1e-6, rtol=0)


def test_fit_distributed_trains_an_uneven_final_batch_as_one_device(rng):
    """21 rows in batches of 8 on 2 replicas: the last 5 split 3/2.

    Each replica averages its own rows; unweighted, the rows of the smaller
    share count more and the weights differed from one device.
    """
    strategy = multigpu.mirrored_strategy(2)
    with strategy.scope():
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference = mlp()
    reference.set_weights(model.get_weights())
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.asarray(rng.standard_normal((21, 8)), "float32")
    y = np.asarray(rng.standard_normal((21, 3)), "float32")
    weights = np.asarray(rng.uniform(0.5, 2.0, 21), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(8)
    history = multigpu.fit_distributed(model, data, epochs=1, verbose=0)
    want = reference.fit(data, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"],
                               want.history["loss"], rtol=1e-5)
    for got, expected in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, atol=1e-6)
    assert "compute_loss" not in vars(model)
