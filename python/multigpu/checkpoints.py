"""Fault tolerance: checkpoint every epoch (or N batches), resume after a crash.

`checkpoint_callbacks(checkpoint_dir)` gives Keras's own callbacks:

* `keras.callbacks.BackupAndRestore` keeps the training state (weights,
  optimizer state and the epoch reached) in `checkpoint_dir/backup`; a
  restarted `fit` restores it and resumes at the epoch that was interrupted.
* `keras.callbacks.ModelCheckpoint` writes full models,
  `checkpoint_dir/ckpt-{epoch}.keras`, that load anywhere.

Both are subclassed only to make their writes atomic: a file is written under
a temporary name and renamed into place, and the backup's weights and epoch
are committed together by one rename of its metadata file, so a process
killed at any moment (SIGKILL, OOM killer, preemption) leaves either the old
checkpoint or the new one, never a torn file.

`make_or_restore_model(checkpoint_dir, build_fn)` returns the newest
`ckpt-*.keras` model, or `build_fn()` when there is none.
"""

import glob
import json
import os
import re
import warnings

import keras
from multigpu.messages import literal

CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d+)(?:-(\d+))?\.keras$")
_TEMP_PREFIX = ".tmp-"
_BACKUP = "backup"
_METADATA = "training_metadata.json"


def _temp_path(path):
    """A hidden sibling of `path` with the same extension."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f"{_TEMP_PREFIX}{os.getpid()}-{name}")


def _commit(temp, path):
    """Flushes `temp` to disk and renames it to `path` (atomic on POSIX)."""
    with open(temp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(temp, path)


def _remove_stale_temporaries(directory):
    """Deletes temporary files a killed process left behind."""
    for path in glob.glob(os.path.join(glob.escape(directory), _TEMP_PREFIX + "*")):
        try:
            os.remove(path)
        except OSError:
            pass


def _check_save_freq(save_freq):
    if save_freq == "epoch":
        return save_freq
    if isinstance(save_freq, int) and not isinstance(save_freq, bool) and (
        save_freq >= 1
    ):
        return save_freq
    raise ValueError(
        f"Invalid `save_freq`: received {literal(save_freq)}; expected {literal('epoch')} "
        "(checkpoint at the end of every epoch) or an int >= 1 (checkpoint "
        "every that many batches)."
    )


def _check_directory(checkpoint_dir):
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not os.fspath(
        checkpoint_dir
    ):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(checkpoint_dir)}; expected "
            "a directory path (created if missing)."
        )
    directory = os.fspath(checkpoint_dir)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(checkpoint_dir)}, which is "
            "a file; expected a directory."
        )
    return directory


class AtomicModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint` whose files appear atomically.

    Keras writes each file under a temporary name in the same directory;
    this class renames it to the real name once it is complete.
    """

    def _get_file_path(self, epoch, batch, logs):
        self._final_path = super()._get_file_path(epoch, batch, logs)
        return _temp_path(self._final_path)

    def _save_model(self, epoch, batch, logs):
        self._final_path = None
        super()._save_model(epoch, batch, logs)
        final = self._final_path
        if final is not None and os.path.exists(_temp_path(final)):
            _commit(_temp_path(final), final)


class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` with an atomic commit.

    Every save writes a new weights file, then commits it by atomically
    replacing the metadata file that names it together with the epoch
    reached; the previous weights file is deleted afterwards. Restoring reads
    the committed metadata, so the weights and the epoch always match.
    """

    def on_train_begin(self, logs=None):
        if os.path.isdir(self.backup_dir):
            _remove_stale_temporaries(self.backup_dir)
        metadata = self._committed_metadata()
        if metadata and "weights" in metadata:
            self._weights_path = os.path.join(
                self.backup_dir, metadata["weights"]
            )
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        # Keras only updates the epoch at epoch ends, so a batch checkpoint
        # taken in the first epoch after a restart would record epoch 0.
        self._current_epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.save_freq != "epoch":
            # Also commit finished epochs, so they are never replayed.
            self._save_model()

    def _committed_metadata(self):
        try:
            with open(self._training_metadata_path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _save_model(self):
        os.makedirs(self.backup_dir, exist_ok=True)
        previous = self._weights_path
        metadata = self._committed_metadata() or {}
        version = int(metadata.get("version", 0)) + 1
        name = f"weights-{version}.weights.h5"
        weights = os.path.join(self.backup_dir, name)
        temp = _temp_path(weights)
        self.model.save_weights(temp, overwrite=True)
        _commit(temp, weights)
        temp = _temp_path(self._training_metadata_path)
        with open(temp, "w") as f:
            json.dump({
                "epoch": self._current_epoch,
                "batch": self._last_batch_seen,
                "weights": name,
                "version": version,
            }, f)
        _commit(temp, self._training_metadata_path)
        self._weights_path = weights
        if previous != weights and os.path.exists(previous):
            os.remove(previous)


def checkpoint_callbacks(checkpoint_dir, save_freq="epoch"):
    """Keras callbacks that checkpoint training and resume it after a crash.

    Pass them to `fit` (or `fit_distributed`) and run the same script again
    after a failure: `fit` restores the last committed state and continues
    at the epoch that was interrupted; only the work since the last
    checkpoint is redone. Once training has finished, running the script
    again trains nothing (ask for more `epochs` to train further).

    Args:
        checkpoint_dir: Directory for the checkpoints (created if missing):
            `ckpt-{epoch}.keras` full models (`ckpt-{epoch}-{batch}.keras`
            with a batch frequency) and the `backup/` training state.
        save_freq: `"epoch"` to checkpoint at the end of every epoch, or an
            int N to checkpoint every N batches (and at every epoch end).
            With N batches, a restart restores the weights of the last
            checkpoint and replays the interrupted epoch from its first
            batch (Keras's BackupAndRestore resumes whole epochs).

    Returns:
        A list `[BackupAndRestore, ModelCheckpoint]` of Keras callbacks (the
        atomic subclasses of this module).

    Raises:
        ValueError: for an invalid `checkpoint_dir` or `save_freq`.

    Example:
    >>> with strategy.scope():
    ...     model = multigpu.make_or_restore_model("ckpt", build_model)
    >>> model.fit(data, epochs=10,
    ...           callbacks=multigpu.checkpoint_callbacks("ckpt"))
    """
    directory = _check_directory(checkpoint_dir)
    save_freq = _check_save_freq(save_freq)
    os.makedirs(directory, exist_ok=True)
    _remove_stale_temporaries(directory)
    name = "ckpt-{epoch}.keras" if save_freq == "epoch" else (
        "ckpt-{epoch}-{batch}.keras"
    )
    return [
        AtomicBackupAndRestore(
            os.path.join(directory, _BACKUP), save_freq=save_freq,
            delete_checkpoint=False,
        ),
        AtomicModelCheckpoint(os.path.join(directory, name),
                              save_freq=save_freq),
    ]


def _checkpoint_rank(name):
    """(epochs completed, batches into the next) for a checkpoint file name.

    `ckpt-3.keras` is saved after epoch 3; `ckpt-3-5.keras` after batch 5 of
    epoch 3, so after 2 complete epochs.
    """
    match = CHECKPOINT_PATTERN.match(name)
    epoch, batch = int(match[1]), match[2]
    return (epoch, 0) if batch is None else (epoch - 1, int(batch))


def list_checkpoints(checkpoint_dir):
    """The `ckpt-*.keras` files of a directory, newest first.

    Newest means last written (a restarted run replays part of an epoch, so
    its checkpoints can carry smaller numbers than older ones); checkpoints
    written at the same time are ordered by epoch and batch.

    Args:
        checkpoint_dir: A directory written by `checkpoint_callbacks`.

    Returns:
        A list of paths, newest first (empty if the directory does not
        exist).
    """
    if not os.path.isdir(checkpoint_dir):
        return []
    paths = [os.path.join(checkpoint_dir, n) for n in os.listdir(checkpoint_dir)
             if CHECKPOINT_PATTERN.match(n)]
    paths.sort(key=lambda p: (os.stat(p).st_mtime_ns,
                              _checkpoint_rank(os.path.basename(p))),
               reverse=True)
    return paths


def make_or_restore_model(checkpoint_dir, build_fn):
    """Restores the newest checkpoint of `checkpoint_dir`, or builds a model.

    Call it inside the strategy's scope (`with strategy.scope():`) so that
    the restored or new model's variables are mirrored. A checkpoint that
    cannot be read is skipped with a warning (the next newest is tried).

    Args:
        checkpoint_dir: Directory written by `checkpoint_callbacks`.
        build_fn: A function of no arguments returning a new compiled model;
            called when there is no readable checkpoint.

    Returns:
        A compiled `keras.Model`: the newest checkpoint (with its optimizer
        state) or `build_fn()`.

    Raises:
        ValueError: for an invalid `checkpoint_dir`.
        TypeError: if `build_fn` is not callable or does not return a
            `keras.Model`.

    Example:
    >>> with strategy.scope():
    ...     model = multigpu.make_or_restore_model("ckpt", get_compiled_model)
    """
    directory = _check_directory(checkpoint_dir)
    if not callable(build_fn):
        raise TypeError(
            f"Invalid `build_fn`: received an object of type "
            f"{type(build_fn).__name__}; expected a function of no arguments "
            "that returns a new compiled keras.Model."
        )
    for path in list_checkpoints(directory):
        try:
            return keras.models.load_model(path)
        except Exception as error:  # noqa: BLE001 - try the next one
            warnings.warn(
                f"Skipping unreadable checkpoint {literal(path)}: "
                f"{type(error).__name__}: {error}",
                UserWarning, stacklevel=2,
            )
    model = build_fn()
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `build_fn`: it returned an object of type "
            f"{type(model).__name__}; expected a compiled keras.Model."
        )
    return model
