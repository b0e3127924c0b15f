"""The atomic replace: a checkpoint file is the old one or the new one, never torn.

docs/fault-tolerance.md, "No torn files": every file is written under a
temporary name and renamed; a failed write removes the temporary file and
leaves the committed checkpoints intact. These tests need no root (the
full-disk test in test_checkpoints.py mounts a tmpfs): the writes fail
midway by hand.
"""

import json
import os

import keras
import numpy as np
import pytest

from multigpu.checkpoints import AtomicModelCheckpoint, atomic, resume
from support.models import mlp

OLD = b"the committed checkpoint"
NEW = b"the next checkpoint, complete"


class Crash(Exception):
    """Stands for a process dying in the middle of a write."""


def _committed(tmp_path):
    path = tmp_path / "weights-1.weights.h5"
    path.write_bytes(OLD)
    return path


def test_a_write_failing_midway_leaves_the_previous_file(tmp_path):
    path = _committed(tmp_path)

    def half_then_die(temp):
        with open(temp, "wb") as f:
            f.write(NEW[: len(NEW) // 2])
        raise Crash()

    written = []
    with pytest.raises(Crash):
        atomic.write_atomically(str(path), half_then_die, written)
    assert path.read_bytes() == OLD
    assert os.listdir(tmp_path) == [path.name]  # no partial file left
    assert written == []


def test_a_failed_rename_leaves_the_previous_file(tmp_path, monkeypatch):
    path = _committed(tmp_path)

    def no_rename(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic.os, "replace", no_rename)
    with pytest.raises(OSError):
        atomic.write_atomically(str(path), lambda temp: open(
            temp, "wb").write(NEW), [])
    assert path.read_bytes() == OLD
    assert os.listdir(tmp_path) == [path.name]


def test_a_write_replaces_the_file_only_once_complete(tmp_path):
    path = _committed(tmp_path)
    seen = []

    def write(temp):
        with open(temp, "wb") as f:
            f.write(NEW)
        # Written but not committed: a reader of the final name, or a
        # process killed now, still has the previous checkpoint.
        seen.append(path.read_bytes())

    written = []
    atomic.write_atomically(str(path), write, written)
    assert seen == [OLD]
    assert path.read_bytes() == NEW
    assert os.listdir(tmp_path) == [path.name]
    assert written == [str(path)]


def _shifted(model, by):
    model.set_weights([w + by for w in model.get_weights()])
    return model.get_weights()


def test_a_backup_whose_metadata_write_dies_keeps_the_previous_state(
        tmp_path, monkeypatch):
    # The metadata is the last file of a save and the one that commits it
    # (`resume.write_state`, which the backup callback calls): replaced in
    # place, a half-written one would lose the committed state.
    backup = tmp_path / "backup"
    model = mlp()
    committed_weights = _shifted(model, 0.0)
    resume.write_state(model, str(backup), {"version": 1, "epoch": 1})
    metadata = backup / resume.METADATA_NAME
    committed = metadata.read_bytes()
    real_dump = atomic.dump_json

    def dump_then_die(state, path):
        if not os.fspath(path).endswith(resume.METADATA_NAME):
            return real_dump(state, path)
        with open(path, "w") as f:
            f.write(json.dumps(state)[:20])
        raise Crash()

    monkeypatch.setattr(atomic, "dump_json", dump_then_die)
    _shifted(model, 1.0)
    with pytest.raises(Crash):
        resume.write_state(model, str(backup), {"version": 2, "epoch": 2})
    monkeypatch.undo()
    assert metadata.read_bytes() == committed
    assert not [n for n in os.listdir(backup)
                if n.startswith(atomic.TEMP_PREFIX)]
    state = resume.read_state(metadata)
    assert state["version"] == 1
    restored = mlp()
    restored.load_weights(backup / state["weights"])
    for got, want in zip(restored.get_weights(), committed_weights):
        np.testing.assert_array_equal(got, want)


def test_a_model_checkpoint_dying_while_replaced_keeps_the_previous_one(
        tmp_path, monkeypatch):
    # The same epoch trained again writes the same name, ckpt-1.keras.
    model = mlp()
    callback = AtomicModelCheckpoint(str(tmp_path / "ckpt-{epoch}.keras"))
    callback.set_model(model)
    first = _shifted(model, 0.0)
    callback.on_epoch_end(0)
    real_save = keras.Model.save

    def dying_save(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"PK\x03\x04 half a zip")
        raise Crash()

    monkeypatch.setattr(keras.Model, "save", dying_save)
    _shifted(model, 1.0)
    with pytest.raises(Crash):
        callback.on_epoch_end(0)
    monkeypatch.setattr(keras.Model, "save", real_save)
    assert os.listdir(tmp_path) == ["ckpt-1.keras"]
    loaded = keras.models.load_model(tmp_path / "ckpt-1.keras")
    for got, want in zip(loaded.get_weights(), first):
        np.testing.assert_array_equal(got, want)
