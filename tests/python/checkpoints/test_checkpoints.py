"""Fault tolerance: checkpoint_callbacks, make_or_restore_model, SIGKILL/resume."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import multigpu
from multigpu import checkpoints
from support.models import data, mlp
from support.worker_scripts import WORKERS, fresh_python

RESUMABLE = os.path.join(WORKERS, "resumable.py")
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


def test_callbacks_are_plain_keras_callbacks(tmp_path):
    backup, checkpoint = multigpu.checkpoint_callbacks(tmp_path / "ckpt")
    assert isinstance(backup, checkpoints.AtomicBackupAndRestore)
    assert isinstance(checkpoint, checkpoints.AtomicModelCheckpoint)
    # Keras's public Callback API only: no private hook of
    # BackupAndRestore or ModelCheckpoint to be silently skipped.
    for callback in (backup, checkpoint):
        assert type(callback).__mro__[1] is keras.callbacks.Callback
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


def test_newest_checkpoint_is_the_furthest_in_training_not_the_newest_file(
        tmp_path):
    names = ("ckpt-2.keras", "ckpt-3-4.keras", "ckpt-3-12.keras",
             "ckpt-10.keras", "ckpt-3.keras", ".tmp-1-ckpt-11.keras")
    for name in names:
        (tmp_path / name).write_bytes(b"")
    got = [os.path.basename(p) for p in checkpoints.list_checkpoints(tmp_path)]
    want = ["ckpt-10.keras", "ckpt-3.keras", "ckpt-3-12.keras",
            "ckpt-3-4.keras", "ckpt-2.keras"]
    assert got == want
    # `touch` (or a copy that rewrites every mtime) changes nothing.
    os.utime(tmp_path / "ckpt-2.keras", ns=(2 * 10**18, 2 * 10**18))
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path, copy)
    for directory in (tmp_path, copy):
        got = [os.path.basename(p)
               for p in checkpoints.list_checkpoints(directory)]
        assert got == want


def test_max_to_keep_prunes_the_oldest_models(tmp_path, rng):
    x, y = data(rng, 48)  # 6 batches of 8
    model = _compiled()
    model.fit(x, y, batch_size=8, epochs=4, verbose=0,
              callbacks=multigpu.checkpoint_callbacks(tmp_path, save_freq=2,
                                                      max_to_keep=2))
    assert [n for n in _files(tmp_path) if n.endswith(".keras")] == [
        "ckpt-4-4.keras", "ckpt-4.keras"]
    assert [n for n in _files(tmp_path / "backup") if n.startswith("w")] == [
        "weights-15.weights.h5", "weights-16.weights.h5"]
    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
              callbacks=multigpu.checkpoint_callbacks(tmp_path / "all",
                                                      max_to_keep=None))
    assert _files(tmp_path / "all") == [".writer.lock", "backup",
                                        "ckpt-1.keras", "ckpt-2.keras"]


@pytest.mark.parametrize("max_to_keep", [0, -1, 1.5, "3", True])
def test_invalid_max_to_keep_is_named(tmp_path, max_to_keep):
    with pytest.raises(ValueError, match=r"`max_to_keep`: received"):
        multigpu.checkpoint_callbacks(tmp_path, max_to_keep=max_to_keep)


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
    real_save_weights = checkpoints.atomic.save_weights_file

    def save_then_die(model, path):
        real_save_weights(model, path)
        raise Crash()  # weights on disk, epoch not recorded yet

    monkeypatch.setattr(checkpoints.atomic, "save_weights_file", save_then_die)
    with pytest.raises(Crash):
        model.fit(x, y, batch_size=8, epochs=3, verbose=0,
                  callbacks=multigpu.checkpoint_callbacks(tmp_path))
    monkeypatch.undo()
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


# Full tier: a SIGKILL point; the gate kills and resumes in test_resume.py's sample.
@pytest.mark.full
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
        assert [line for line in lines if line.startswith("epoch-begin")] == [
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
        assert [line for line in lines if line.startswith("epoch-begin")] == [
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


def _trained_into(directory, x, y, epochs=2):
    model = _compiled()
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False,
              callbacks=multigpu.checkpoint_callbacks(directory))
    return model


@pytest.mark.parametrize("damage", ["truncated weights", "empty metadata"])
def test_a_corrupt_backup_falls_back_to_the_previous_state(
        tmp_path, rng, damage):
    x, y = data(rng, 16)
    model = _compiled()
    epochs_weights = []
    for epochs in (1, 2):
        model.fit(x, y, batch_size=8, epochs=epochs, verbose=0,
                  shuffle=False, initial_epoch=epochs - 1,
                  callbacks=multigpu.checkpoint_callbacks(tmp_path))
        epochs_weights.append(model.get_weights())
    backup = tmp_path / "backup"
    if damage == "truncated weights":
        bad = backup / "weights-2.weights.h5"
        bad.write_bytes(bad.read_bytes()[:100])
    else:
        bad = backup / "training_metadata.json"
        bad.write_text("")
    with pytest.warns(UserWarning, match=re.escape(str(bad))):
        probe = _probe_restart(tmp_path)
    if damage == "truncated weights":
        assert probe.first_epoch == 1  # the previous state: after epoch 1
        want = epochs_weights[0]
    else:
        assert probe.first_epoch == 2  # state-2.json is intact
        want = epochs_weights[1]
    for got, expected in zip(probe.start_weights, want):
        np.testing.assert_array_equal(got, expected)


def test_a_backup_with_no_good_state_falls_back_to_the_newest_model(
        tmp_path, rng):
    x, y = data(rng, 16)
    model = _trained_into(tmp_path, x, y)
    for path in (tmp_path / "backup").iterdir():
        path.write_bytes(b"")
    with pytest.warns(UserWarning, match="resuming from .*ckpt-2.keras"):
        probe = _probe_restart(tmp_path)
    assert probe.first_epoch == 2
    for got, expected in zip(probe.start_weights, model.get_weights()):
        np.testing.assert_array_equal(got, expected)


def test_a_full_disk_gives_a_clear_error_and_keeps_the_committed_state(
        tmp_path, rng, monkeypatch):
    x, y = data(rng, 16)
    model = _trained_into(tmp_path, x, y, epochs=1)
    before = _files(tmp_path / "backup")
    def disk_full(model, path):
        with open(path, "wb") as f:
            f.write(b"\x89HDF partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints.atomic, "save_weights_file", disk_full)
    with pytest.raises(OSError, match=r"could not write the checkpoint.*"
                       r"backup.*No space left on device.*intact"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
                  callbacks=multigpu.checkpoint_callbacks(tmp_path))
    monkeypatch.undo()
    assert _files(tmp_path / "backup") == before  # temp file removed
    assert _probe_restart(tmp_path).first_epoch == 1


def test_an_unusable_checkpoint_dir_is_refused_before_training(
        tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"`checkpoint_dir`.*cannot be created"):
        multigpu.make_or_restore_model(tmp_path / "file" / "ckpt", _compiled)
    # Root ignores permission bits, so the test asks os.access to say no.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match=r"cannot write to"):
        multigpu.checkpoint_callbacks(tmp_path / "locked")


def test_numpy_scalars_are_accepted(tmp_path):
    callbacks = multigpu.checkpoint_callbacks(
        tmp_path, save_freq=np.int64(2), max_to_keep=np.int32(1))
    assert callbacks[0].save_freq == 2 and callbacks[1].max_to_keep == 1


DISK_FULL = os.path.join(WORKERS, "disk_full.py")


# Full tier: a process fault in depth (a real full disk in a child process).
@pytest.mark.full
def test_a_really_full_disk_raises_oserror_not_a_segfault(tmp_path):
    """A 300 KiB tmpfs fills up during training (needs root to mount)."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k",
                              "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the failing "
                    "writer test covers the same code path")
    try:
        for units in (600, 1200):  # the backup, then the model, hits ENOSPC
            directory = mount / f"ckpt-{units}"
            result = subprocess.run(
                [sys.executable, DISK_FULL, str(directory), str(units)],
                capture_output=True, text=True, timeout=RUN_TIMEOUT)
            assert result.returncode == 0, result.stderr[-2000:]
            assert "OSError: [Errno 28] checkpoint_callbacks could not write" \
                in result.stdout
            assert "intact" in result.stdout
            names = [n for _, _, files in os.walk(directory) for n in files]
            assert not [n for n in names if n.startswith(".tmp")], names
            assert "weights-1.weights.h5" in names
            subprocess.run(["rm", "-rf", str(directory)], check=True)
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.parametrize("save_freq, want", [
    # 6 batches of 8 per epoch.
    (4, ["ckpt-1-4.keras", "ckpt-1.keras", "ckpt-2-4.keras", "ckpt-2.keras"]),
    # The epoch's last batch is saved once, under the epoch's name.
    (3, ["ckpt-1-3.keras", "ckpt-1.keras", "ckpt-2-3.keras", "ckpt-2.keras"]),
    # More batches than an epoch: the epoch ends still write models.
    (100, ["ckpt-1.keras", "ckpt-2.keras"]),
])
def test_a_batch_frequency_also_writes_a_model_at_every_epoch_end(
        tmp_path, rng, save_freq, want):
    model = _compiled()
    model.fit(*data(rng, 48), batch_size=8, epochs=2, verbose=0,
              callbacks=multigpu.checkpoint_callbacks(
                  tmp_path, save_freq=save_freq, max_to_keep=None))
    assert [n for n in _files(tmp_path) if n.endswith(".keras")] == sorted(want)
    newest = checkpoints.list_checkpoints(tmp_path)[0]
    assert os.path.basename(newest) == "ckpt-2.keras"
    restored = multigpu.make_or_restore_model(tmp_path, _compiled)
    for got, expected in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, expected)
    assert restored.optimizer.iterations.numpy() == 12


def test_a_file_named_backup_is_refused_before_training(tmp_path):
    (tmp_path / "backup").write_text("not a directory")
    with pytest.raises(ValueError, match=(
            r"`checkpoint_dir`.*holds a file named 'backup'.*Move or rename")):
        multigpu.checkpoint_callbacks(tmp_path)


def test_steps_per_execution_above_1_with_a_batch_frequency_warns(
        tmp_path, rng):
    model = mlp()
    model.compile(optimizer="adam", loss="mse", steps_per_execution=2)
    with pytest.warns(UserWarning, match=(
            r"steps_per_execution=2.*not continue at the exact batch.*"
            r"steps_per_execution=1")):
        model.fit(*data(rng, 32), batch_size=8, epochs=1, verbose=0,
                  callbacks=multigpu.checkpoint_callbacks(tmp_path, 2))


def test_a_builder_returning_an_uncompiled_model_is_named(tmp_path):
    with pytest.raises(ValueError, match=(
            r"`build_fn`: it returned the model 'mlp', which is not "
            r"compiled.*model.compile")):
        multigpu.make_or_restore_model(tmp_path, mlp)


_HOLDER = """
import sys, time
import multigpu
callbacks = multigpu.checkpoint_callbacks(sys.argv[1])
print("LOCKED", flush=True)
time.sleep(600)
"""


def test_a_second_writer_is_refused_until_the_first_is_killed(tmp_path, rng):
    directory = tmp_path / "ckpt"
    holder = subprocess.Popen(
        [*fresh_python(_HOLDER), str(directory)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        _wait_for(holder, "LOCKED")
        with pytest.raises(ValueError, match=(
                rf"`checkpoint_dir`: received .*, which process {holder.pid} "
                r"on .* is training into\. Two runs writing one checkpoint "
                r"directory interleave.*released when that process ends")):
            multigpu.checkpoint_callbacks(directory)
        # Reading is not writing.
        multigpu.make_or_restore_model(directory, _compiled)
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(timeout=RUN_TIMEOUT) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
    # The killed holder's lock went with it.
    model = _compiled()
    model.fit(*data(rng, 16), batch_size=8, epochs=1, verbose=0,
              callbacks=multigpu.checkpoint_callbacks(directory))
    assert "ckpt-1.keras" in _files(directory)


def test_one_process_may_train_a_directory_again(tmp_path, rng):
    x, y = data(rng, 16)
    first = multigpu.checkpoint_callbacks(tmp_path)
    # A second set in the same process (a re-run in one R session) is no
    # second writer.
    second = multigpu.checkpoint_callbacks(tmp_path)
    assert first[0].writer_lock is second[0].writer_lock
    _compiled().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=first)
    assert not first[0].writer_lock.held  # released when training ends
    _compiled().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=second)
    assert "ckpt-2.keras" in _files(tmp_path)
