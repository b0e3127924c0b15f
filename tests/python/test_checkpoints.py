"""Fault tolerance: checkpoint_callbacks, make_or_restore_model, SIGKILL/resume."""

import json
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import multigpu
from multigpu import checkpoints
from models import data, mlp

HERE = os.path.dirname(os.path.abspath(__file__))
RESUMABLE = os.path.join(HERE, "workers", "resumable.py")
RUN_TIMEOUT = 180


class Crash(Exception):
    """Stands for a process dying in the middle of training."""


class CrashAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise Crash()


class Probe(keras.callbacks.Callback):
    """Records the weights fit starts from and the first epoch it runs."""

    def on_train_begin(self, logs=None):
        self.start_weights = self.model.get_weights()

    def on_epoch_begin(self, epoch, logs=None):
        self.first_epoch = epoch
        raise Crash()


def _compiled():
    model = mlp()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def _probe_restart(directory, save_freq="epoch"):
    probe = Probe()
    model = _compiled()
    with pytest.raises(Crash):
        model.fit(*data(np.random.default_rng(0), 48), batch_size=8, epochs=9,
                  verbose=0, callbacks=multigpu.checkpoint_callbacks(
                      directory, save_freq) + [probe])
    return probe


def _files(directory):
    return sorted(os.listdir(directory))


def test_callbacks_are_keras_backup_and_restore_and_model_checkpoint(tmp_path):
    backup, checkpoint = multigpu.checkpoint_callbacks(tmp_path / "ckpt")
    assert isinstance(backup, keras.callbacks.BackupAndRestore)
    assert isinstance(checkpoint, keras.callbacks.ModelCheckpoint)
    assert (tmp_path / "ckpt").is_dir()


@pytest.mark.parametrize("save_freq", [0, -3, "batch", 1.5, True])
def test_invalid_save_freq_is_named(tmp_path, save_freq):
    with pytest.raises(ValueError, match=r"`save_freq`: received"):
        multigpu.checkpoint_callbacks(tmp_path, save_freq)


def test_checkpoint_dir_that_is_a_file_is_rejected(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"`checkpoint_dir`.*is a file"):
        multigpu.checkpoint_callbacks(path)
    with pytest.raises(TypeError, match=r"`build_fn`"):
        multigpu.make_or_restore_model(tmp_path, "not callable")


def test_make_or_restore_builds_then_restores_the_newest(tmp_path, rng):
    built = []

    def build():
        built.append(1)
        return _compiled()

    model = multigpu.make_or_restore_model(tmp_path, build)
    assert built == [1]
    x, y = data(rng, 48)
    model.fit(x, y, batch_size=8, epochs=3, verbose=0,
              callbacks=multigpu.checkpoint_callbacks(tmp_path))
    assert {"ckpt-1.keras", "ckpt-2.keras", "ckpt-3.keras"} <= set(
        _files(tmp_path))
    restored = multigpu.make_or_restore_model(tmp_path, build)
    assert built == [1]
    for got, want in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert restored.optimizer.iterations.numpy() == 18


def test_make_or_restore_skips_an_unreadable_checkpoint(tmp_path, rng):
    model = _compiled()
    model.fit(*data(rng, 16), batch_size=8, epochs=1, verbose=0,
              callbacks=multigpu.checkpoint_callbacks(tmp_path))
    (tmp_path / "ckpt-7.keras").write_bytes(b"PK\x03\x04 torn")
    with pytest.warns(UserWarning, match="ckpt-7.keras"):
        restored = multigpu.make_or_restore_model(tmp_path, _compiled)
    np.testing.assert_array_equal(restored.get_weights()[0],
                                  model.get_weights()[0])


def test_newest_checkpoint_is_the_last_written_then_the_furthest(tmp_path):
    names = ("ckpt-2.keras", "ckpt-3-4.keras", "ckpt-3-12.keras",
             "ckpt-10.keras", "ckpt-3.keras", ".tmp-1-ckpt-11.keras")
    for name in names:
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, ns=(10**9, 10**9))
    got = [os.path.basename(p) for p in checkpoints.list_checkpoints(tmp_path)]
    assert got == ["ckpt-10.keras", "ckpt-3.keras", "ckpt-3-12.keras",
                   "ckpt-3-4.keras", "ckpt-2.keras"]
    os.utime(tmp_path / "ckpt-2.keras", ns=(2 * 10**9, 2 * 10**9))
    assert checkpoints.list_checkpoints(tmp_path)[0].endswith("ckpt-2.keras")


def test_a_crash_while_writing_a_model_leaves_no_torn_checkpoint(
        tmp_path, rng, monkeypatch):
    real_save = keras.Model.save
    calls = []

    def dying_save(self, filepath, *args, **kwargs):
        calls.append(filepath)
        if len(calls) == 2:  # the second checkpoint dies half written
            with open(filepath, "wb") as f:
                f.write(b"PK\x03\x04 half a zip")
            raise Crash()
        return real_save(self, filepath, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", dying_save)
    model = _compiled()
    with pytest.raises(Crash):
        model.fit(*data(rng, 16), batch_size=8, epochs=3, verbose=0,
                  callbacks=multigpu.checkpoint_callbacks(tmp_path))
    monkeypatch.setattr(keras.Model, "save", real_save)
    assert "ckpt-2.keras" not in _files(tmp_path)
    keras.models.load_model(tmp_path / "ckpt-1.keras")
    restored = multigpu.make_or_restore_model(tmp_path, _compiled)
    assert restored.optimizer.iterations.numpy() == 2
    multigpu.checkpoint_callbacks(tmp_path)  # a restart cleans up
    assert not [n for n in _files(tmp_path) if n.startswith(".tmp")]


def test_a_crash_between_weights_and_epoch_keeps_them_consistent(
        tmp_path, rng, monkeypatch):
    x, y = data(rng, 48)
    model = _compiled()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=multigpu.checkpoint_callbacks(tmp_path))
    after_epoch_1 = model.get_weights()
    real_save_weights = keras.Model.save_weights

    def save_then_die(self, *args, **kwargs):
        real_save_weights(self, *args, **kwargs)
        raise Crash()  # weights on disk, epoch not recorded yet

    monkeypatch.setattr(keras.Model, "save_weights", save_then_die)
    with pytest.raises(Crash):
        model.fit(x, y, batch_size=8, epochs=3, verbose=0,
                  callbacks=multigpu.checkpoint_callbacks(tmp_path))
    monkeypatch.setattr(keras.Model, "save_weights", real_save_weights)
    probe = _probe_restart(tmp_path)
    assert probe.first_epoch == 1
    for got, want in zip(probe.start_weights, after_epoch_1):
        np.testing.assert_array_equal(got, want)


def test_batch_checkpoints_record_the_epoch_after_a_restart(tmp_path, rng):
    x, y = data(rng, 48)  # 6 batches of 8 per epoch

    def crash_at(epoch, batch):
        with pytest.raises(Crash):
            _compiled().fit(x, y, batch_size=8, epochs=3, verbose=0,
                            callbacks=multigpu.checkpoint_callbacks(
                                tmp_path, save_freq=4)
                            + [CrashAt(epoch, batch)])

    def committed():
        return json.loads(
            (tmp_path / "backup" / "training_metadata.json").read_text())

    crash_at(1, 5)  # epoch 0 ends with a commit; epoch 1 saves at batch 3
    assert committed()["epoch"] == 1
    crash_at(1, 4)  # resumes in epoch 1; its batch-3 save must say so
    assert committed()["epoch"] == 1
    assert _probe_restart(tmp_path, save_freq=4).first_epoch == 1
    assert "ckpt-2-4.keras" in _files(tmp_path)


def _run(checkpoint_dir, out, *extra):
    return subprocess.Popen(
        [sys.executable, RESUMABLE, str(checkpoint_dir), str(out), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )


def _wait_for(process, marker):
    lines = []
    for line in process.stdout:
        lines.append(line.strip())
        if line.strip() == marker:
            return lines
    raise AssertionError(f"{marker!r} never printed; output: {lines}")


def test_sigkill_mid_epoch_then_restart_finishes_like_an_unbroken_run(
        tmp_path):
    unbroken = _run(tmp_path / "unbroken", tmp_path / "unbroken.npz")
    killed = _run(tmp_path / "ckpt", tmp_path / "resumed.npz",
                  "--pause-at", "2", "2")
    try:
        lines = _wait_for(killed, "PAUSED")
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=RUN_TIMEOUT)
        assert killed.returncode == -signal.SIGKILL
        assert [l for l in lines if l.startswith("epoch-begin")] == [
            "epoch-begin 0", "epoch-begin 1", "epoch-begin 2"]
        names = _files(tmp_path / "ckpt")
        assert "ckpt-2.keras" in names and "ckpt-3.keras" not in names
        for name in names:
            if name.endswith(".keras"):
                keras.models.load_model(tmp_path / "ckpt" / name)

        resumed = _run(tmp_path / "ckpt", tmp_path / "resumed.npz")
        lines = _wait_for(resumed, "finished")
        assert resumed.wait(timeout=RUN_TIMEOUT) == 0
        # Only the interrupted epoch 2 is redone.
        assert [l for l in lines if l.startswith("epoch-begin")] == [
            "epoch-begin 2", "epoch-begin 3"]
        assert unbroken.wait(timeout=RUN_TIMEOUT) == 0
    finally:
        for process in (unbroken, killed):
            if process.poll() is None:
                process.kill()
    got = np.load(tmp_path / "resumed.npz")
    want = np.load(tmp_path / "unbroken.npz")
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-6)
    assert not [n for n in _files(tmp_path / "ckpt") if n.startswith(".tmp")]
    assert not [n for n in _files(tmp_path / "ckpt" / "backup")
                if n.startswith(".tmp")]
