"""The callback that writes full models, `ckpt-*.keras`, atomically."""

import os

import keras

from multigpu.checkpoints import atomic, listing
from multigpu.checkpoints.arguments import check_save_freq
from multigpu.checkpoints.lock import writes_checkpoints
from multigpu.checkpoints.resume import ResumePosition
from multigpu.messages import literal


class AtomicModelCheckpoint(keras.callbacks.Callback):
    """Saves the whole model (`model.save`) to files that appear atomically.

    What `keras.callbacks.ModelCheckpoint` does with its defaults, made
    safe against a killed process: each model is written under a temporary
    name in the same directory and renamed to the real name once complete;
    the newest `max_to_keep` are kept; in multi-worker training only the
    chief writes. With a batch frequency it saves every `save_freq` trained
    batches counted from the last epoch end (batches a resumed run skips do
    not count), so an interrupted and resumed run writes the same files as
    an uninterrupted one, and at every epoch end to `epoch_filepath`; when
    the epoch's last batch was just saved, that file is renamed rather than
    written twice.

    Args:
        filepath: Path pattern of the models: `{epoch}` (and `{batch}` with
            a batch frequency) and the names of logged metrics are filled
            in, as `keras.callbacks.ModelCheckpoint` does (both from 1).
        save_freq: `"epoch"` or an int N (every N trained batches).
        max_to_keep: How many newest `ckpt-*.keras` to keep; None keeps all.
        position: The `ResumePosition` shared with the backup callback.
        epoch_filepath: Path pattern of the epoch-end models with a batch
            frequency (`{epoch}` only); defaults to `filepath`.

    Example:
    >>> callback = AtomicModelCheckpoint("ckpt/ckpt-{epoch}.keras",
    ...                                  max_to_keep=3)
    >>> model.fit(data, epochs=5, callbacks=[callback])
    """

    def __init__(self, filepath, save_freq="epoch", max_to_keep=None,
                 position=None, epoch_filepath=None):
        super().__init__()
        self.filepath = os.fspath(filepath)
        self.save_freq = check_save_freq(save_freq)
        self.max_to_keep = max_to_keep
        self.epoch_filepath = os.fspath(epoch_filepath or self.filepath)
        self.position = position or ResumePosition()
        self._epoch = 0
        self._trained_since_save = 0
        self._last_batch_save = None

    def on_train_begin(self, logs=None):
        self._trained_since_save = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._last_batch_save = None

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq == "epoch" or self.position.skipped:
            return
        self._last_batch_save = None
        self._trained_since_save += 1
        if self._trained_since_save >= self.save_freq:
            self._trained_since_save = 0
            self._last_batch_save = self._save(
                self._path(self.filepath, self._epoch, batch, logs))

    def on_epoch_end(self, epoch, logs=None):
        self._trained_since_save = 0
        just_saved, self._last_batch_save = self._last_batch_save, None
        final = self._path(self.epoch_filepath, epoch, None, logs)
        if just_saved and os.path.exists(just_saved):
            # The epoch's last batch was saved: same weights, same optimizer
            # state; the file gets the epoch-end name.
            os.replace(just_saved, final)
            return
        self._save(final)

    def _path(self, pattern, epoch, batch, logs):
        """`pattern` filled in as `keras.callbacks.ModelCheckpoint` does."""
        values = dict(logs or {})
        values["epoch"] = epoch + 1
        if batch is not None:
            values.setdefault("batch", batch + 1)
        try:
            return pattern.format(**values)
        except KeyError as error:
            raise ValueError(
                f"Invalid `filepath`: received {literal(pattern)}, whose "
                f"placeholder {error} is neither epoch, batch nor a logged "
                f"metric ({literal(sorted(values))}); use those names."
            ) from None

    def _save(self, path):
        """Writes the model to `path` atomically; the path, or None if not."""
        if not writes_checkpoints(self.model):
            return None
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        temp = atomic.temp_path(path)
        try:
            self.model.save(temp, overwrite=True)
        except Exception as error:
            atomic.remove_quietly(temp)
            if isinstance(error, OSError):
                raise atomic.write_error(error, path) from error
            raise
        atomic.commit(temp, path)
        listing.prune_checkpoints(directory, self.max_to_keep)
        return path
