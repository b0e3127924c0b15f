"""Fault tolerance: checkpoint every epoch (or N batches), resume exactly.

`checkpoint_callbacks(checkpoint_dir)` gives Keras's own callbacks,
subclassed:

* `keras.callbacks.BackupAndRestore` keeps the training state in
  `checkpoint_dir/backup`: weights and optimizer state, the epoch and the
  batches trained in it, and the seed-generator states. A restarted `fit`
  (or `fit_distributed`) restores it, resumes at that epoch and skips the
  batches already trained (its train function draws them without training),
  so it continues exactly where the killed run committed. A corrupt state
  falls back to the previous one, then to the newest `ckpt-*.keras`.
* `keras.callbacks.ModelCheckpoint` writes full models,
  `checkpoint_dir/ckpt-{epoch}.keras`, that load anywhere; the newest
  `max_to_keep` are kept.

Every file is written under a temporary name and renamed into place, and the
backup's weights and position are committed together by one rename of its
metadata file, so a process killed at any moment (SIGKILL, OOM killer,
preemption) leaves either the old checkpoint or the new one, never a torn
file. In multi-worker training only the chief writes. One process writes a
directory at a time (`WriterLock`); a second one is refused up front.

`make_or_restore_model(checkpoint_dir, build_fn)` returns the newest
`ckpt-*.keras` model (by epoch and batch), or `build_fn()` when there is none.
"""

import datetime
import errno
import glob
import inspect
import io
import json
import os
import re
import socket
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.common import global_state

from multigpu import cluster as cluster_lib
from multigpu import data as data_lib
from multigpu import internals
from multigpu.arguments import check_int
from multigpu.messages import api, literal, setting

CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d+)(?:-(\d+))?\.keras$")
_TEMP_PREFIX = ".tmp-"
_BACKUP = "backup"
_METADATA = "training_metadata.json"
_LOCK = ".writer.lock"
_STATE_PATTERN = re.compile(r"^state-(\d+)\.json$")
_WEIGHTS_PATTERN = re.compile(r"^weights-(\d+)\.weights\.h5$")
DEFAULT_MAX_TO_KEEP = 3


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


def writes_checkpoints(model):
    """Whether this process writes checkpoints while training `model`.

    Asks the model's strategy (`extended.should_checkpoint`, False on the
    non-chief workers of a `MultiWorkerMirroredStrategy`), then `TF_CONFIG`.
    """
    strategy = getattr(model, "distribute_strategy", None)
    should = getattr(getattr(strategy, "extended", None),
                     "should_checkpoint", True)
    return bool(should) and cluster_lib.is_chief()


def _check_save_freq(save_freq):
    if isinstance(save_freq, str) and save_freq == "epoch":
        return save_freq
    return check_int("save_freq", save_freq, 1, expected=(
        f"{literal('epoch')} (checkpoint at the end of every epoch) or an int "
        ">= 1 (checkpoint every that many batches)"))


def _check_directory(checkpoint_dir):
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not os.fspath(
        checkpoint_dir
    ):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(checkpoint_dir)}; "
            "expected a directory path (created if missing)."
        )
    directory = os.fspath(checkpoint_dir)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
            "is a file; expected a directory."
        )
    return directory


class ResumePosition:
    """Where a restarted `fit` resumes, shared by the checkpoint callbacks.

    The backup callback sets `skip` to the batches of the resumed epoch
    that were trained before the interruption; the model's train function
    then draws those batches without training on them (so the data is at
    the same place as in an uninterrupted run), and `skipped` tells the
    callbacks that the batch just ended was such a batch.
    """

    def __init__(self):
        self.skip = 0
        self.skipped = False


def _skipping(train_function, model, position):
    """Wraps a train function: its first `position.skip` batches only draw."""

    def train(iterator):
        if position.skip > 0:
            for _ in range(max(int(getattr(model, "steps_per_execution", 1)
                                   or 1), 1)):
                next(iterator)
                position.skip -= 1
            position.skipped = True
            return {}
        position.skipped = False
        return train_function(iterator)

    train.skipped_function = train_function
    return train


def _random_state_variables(model):
    """The seed-generator states a training step draws from.

    Keras saves a model's weights and optimizer, not the states of its
    `SeedGenerator`s (dropout, noise layers) nor the global one that
    unseeded `keras.random` calls use; a resumed run restores them so its
    random draws continue where the interrupted run's stopped.
    """
    states = {v.path: v for v in model.non_trainable_variables
              if v.path.endswith("seed_generator_state")}
    generator = global_state.get_global_attribute("global_seed_generator")
    if generator is not None:
        states["global_seed_generator"] = generator.state
    return states


def _warn_if_not_replayable(model, callback):
    """Warns once at the start of training when the input cannot be replayed."""
    problem = _input_replay_problem(model)
    if problem and not getattr(callback, "replay_warning_shown", False):
        callback.replay_warning_shown = True
        warnings.warn(
            "checkpoint_callbacks: the training data cannot be replayed "
            f"exactly ({problem}); a resumed run continues at the right "
            "step with the right weights, optimizer and random state, but "
            "with other batches than an uninterrupted run would see.",
            UserWarning, stacklevel=2,
        )


def _input_replay_problem(model):
    """Inspects the data the running `fit`/`fit_distributed` iterates."""
    frame = inspect.currentframe()
    while frame is not None:
        local = frame.f_locals
        if local.get("self") is model and "epoch_iterator" in local:
            return _adapter_problem(local["epoch_iterator"])
        if frame.f_code.co_name == "fit_distributed" and (
                local.get("model") is model):
            dataset = local.get("dataset")
            if isinstance(dataset, tf.data.Dataset):
                return data_lib.replay_problem(dataset)
            return None
        frame = frame.f_back
    return None


def _adapter_problem(epoch_iterator):
    adapter = getattr(epoch_iterator, "data_adapter", None)
    kind = type(adapter).__name__
    if kind == "ArrayDataAdapter" and internals.adapter_shuffles(adapter):
        return (f"fit({setting('shuffle', True)}) shuffles arrays without "
                f"a seed; pass {setting('shuffle', False)}, or a dataset made by "
                f"{api('distributed_dataset', f'x, y, shuffle={literal(True)}, seed=...')}")
    if kind in ("GeneratorDataAdapter", "PyDatasetAdapter"):
        return ("a Python generator or PyDataset is replayed only if it "
                "yields the same batches in every epoch")
    dataset = internals.adapter_dataset(adapter)
    if isinstance(dataset, tf.data.Dataset):
        return data_lib.replay_problem(dataset)
    return None


class AtomicModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint` whose files appear atomically.

    Keras writes each file under a temporary name in the same directory;
    this class renames it to the real name once it is complete, keeps the
    newest `max_to_keep`, and (in multi-worker training) writes on the
    chief only. With a batch frequency it saves every `save_freq` trained
    batches counted from the last epoch end, so an interrupted and resumed
    run writes the same files as an uninterrupted one, and at every epoch
    end to `epoch_filepath`; when the epoch's last batch was just saved,
    that file is renamed rather than written twice.

    Args:
        filepath: Path pattern of the models, `{epoch}` (and `{batch}` with
            a batch frequency) filled in by Keras.
        save_freq: `"epoch"` or an int N (every N trained batches).
        max_to_keep: How many newest `ckpt-*.keras` to keep; None keeps all.
        position: The `ResumePosition` shared with the backup callback.
        epoch_filepath: Path pattern of the epoch-end models with a batch
            frequency (`{epoch}` only); defaults to `filepath`.
    """

    def __init__(self, filepath, save_freq="epoch", max_to_keep=None,
                 position=None, epoch_filepath=None):
        super().__init__(filepath, save_freq=save_freq)
        self.max_to_keep = max_to_keep
        self.epoch_filepath = epoch_filepath or self.filepath
        self._position = position or ResumePosition()
        self._trained_since_save = 0
        self._last_batch_save = None
        self._last_committed = None

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._last_batch_save = None

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq == "epoch" or self._position.skipped:
            return
        self._last_batch_save = None
        self._trained_since_save += 1
        if self._trained_since_save >= self.save_freq:
            self._trained_since_save = 0
            self._last_committed = None
            self._save_model(epoch=self._current_epoch, batch=batch,
                             logs=logs)
            self._last_batch_save = self._last_committed

    def on_epoch_end(self, epoch, logs=None):
        self._trained_since_save = 0
        if self.save_freq == "epoch":
            super().on_epoch_end(epoch, logs)
            return
        if self.monitor_op is None:
            self._set_monitor_op()
        just_saved = self._last_batch_save
        self._last_batch_save = None
        if just_saved and os.path.exists(just_saved):
            # The epoch's last batch was saved: same weights, same optimizer
            # state; the file gets the epoch-end name.
            final = self.epoch_filepath.format(epoch=epoch + 1, **(logs or {}))
            os.replace(just_saved, final)
            return
        self._save_model(epoch=epoch, batch=None, logs=logs)

    def _get_file_path(self, epoch, batch, logs):
        if batch is None and self.save_freq != "epoch":
            self._final_path = self.epoch_filepath.format(
                epoch=epoch + 1, **(logs or {}))
        else:
            self._final_path = super()._get_file_path(epoch, batch, logs)
        return _temp_path(self._final_path)

    def _save_model(self, epoch, batch, logs):
        if not writes_checkpoints(self.model):
            return
        self._final_path = None
        try:
            super()._save_model(epoch, batch, logs)
        except Exception as error:
            if self._final_path is not None:
                _remove_quietly(_temp_path(self._final_path))
            if isinstance(error, OSError):
                raise write_error(error, self._final_path or self.filepath) from error
            raise
        final = self._final_path
        if final is not None and os.path.exists(_temp_path(final)):
            _commit(_temp_path(final), final)
            self._last_committed = final
            prune_checkpoints(os.path.dirname(final), self.max_to_keep)


class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that resumes at the interrupted step.

    Every save writes a new weights file (weights and optimizer state) and
    a state file (epoch, batches trained in it, random-generator states),
    then commits both by atomically replacing `training_metadata.json`; the
    previous state is kept as a fallback and older ones deleted. A restart
    restores the newest readable state (warning about, and skipping, a
    corrupt one), resumes at its epoch and skips the batches already
    trained in it, so the rest of training sees the same batches, weights,
    optimizer and random state as an uninterrupted run would.
    """

    def __init__(self, backup_dir, save_freq="epoch", position=None,
                 lock=None):
        super().__init__(backup_dir, save_freq=save_freq,
                         delete_checkpoint=False)
        self.writer_lock = lock
        self._position = position or ResumePosition()
        self._trained_since_save = 0
        self._trained_in_epoch = 0
        self._resumed_epoch = None
        self._version = 0

    def on_train_begin(self, logs=None):
        writes = writes_checkpoints(self.model)
        if writes and self.writer_lock is not None:
            # Released at the end of the last training; taken again here.
            self.writer_lock.acquire()
        if os.path.isdir(self.backup_dir) and writes:
            _remove_stale_temporaries(self.backup_dir)
        _warn_if_not_replayable(self.model, self)
        _warn_if_steps_per_execution(self.model, self.save_freq)
        state = self._restore()
        self._position.skip = 0
        self._position.skipped = False
        self._trained_since_save = 0
        if state is None:
            return
        self._current_epoch = int(state["epoch"])
        internals.set_initial_epoch(self.model, self._current_epoch)
        self._position.skip = int(state.get("steps", 0))
        self._resumed_epoch = self._current_epoch
        train_function = getattr(self.model, "train_function", None)
        if self._position.skip and train_function is not None:
            self.model.train_function = _skipping(
                getattr(train_function, "skipped_function", train_function),
                self.model, self._position)

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch
        resumed = self._resumed_epoch == epoch
        self._trained_in_epoch = self._position.skip if resumed else 0
        data_lib.set_training_epoch(epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self._position.skipped:
            return
        self._trained_in_epoch += 1
        if self.save_freq == "epoch":
            return
        self._trained_since_save += 1
        if self._trained_since_save >= self.save_freq:
            self._save_model()

    def on_epoch_end(self, epoch, logs=None):
        self._current_epoch = epoch + 1
        self._trained_in_epoch = 0
        self._resumed_epoch = None
        # Finished epochs are committed at every frequency: never replayed.
        self._save_model()

    def on_train_end(self, logs=None):
        data_lib.set_training_epoch(None)
        train_function = getattr(self.model, "train_function", None)
        original = getattr(train_function, "skipped_function", None)
        if original is not None:
            self.model.train_function = original
        if self.writer_lock is not None:
            self.writer_lock.release()

    def _states(self):
        """Candidate committed states, newest first: (path, metadata)."""
        paths = [self._training_metadata_path]
        if os.path.isdir(self.backup_dir):
            named = [n for n in os.listdir(self.backup_dir)
                     if _STATE_PATTERN.match(n)]
            named.sort(key=lambda n: int(_STATE_PATTERN.match(n)[1]),
                       reverse=True)
            paths += [os.path.join(self.backup_dir, n) for n in named]
        return [p for p in paths if os.path.exists(p)]

    def _restore(self):
        """Loads the newest readable state; returns its metadata or None."""
        if not self.model.built:
            return super()._load_model()  # Keras's error for unbuilt models
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        candidates = self._states()
        tried = set()
        for path in candidates:
            reading = path
            try:
                with open(path) as f:
                    state = json.load(f)
                weights = os.path.join(self.backup_dir, state["weights"])
                if weights in tried:
                    continue
                tried.add(weights)
                reading = weights
                self.model.load_weights(weights)
                self._restore_random_state(state.get("random", {}))
            except Exception as error:  # noqa: BLE001 - fall back
                warnings.warn(
                    f"checkpoint_callbacks: skipping the unreadable backup "
                    f"file {literal(reading)} ({type(error).__name__}: "
                    f"{error}); falling back to an older state.",
                    UserWarning, stacklevel=2,
                )
                continue
            self._version = int(state.get("version", 0))
            self._weights_path = weights
            return state
        return self._restore_from_models() if candidates else None

    def _restore_from_models(self):
        """Falls back to the newest readable `ckpt-*.keras` full model."""
        directory = os.path.dirname(os.path.abspath(self.backup_dir))
        for path in list_checkpoints(directory):
            try:
                self.model.load_weights(path)
            except Exception as error:  # noqa: BLE001 - try the next one
                warnings.warn(
                    f"checkpoint_callbacks: skipping the unreadable "
                    f"checkpoint {literal(path)} ({type(error).__name__}).",
                    UserWarning, stacklevel=2,
                )
                continue
            epochs, batches = checkpoint_position(os.path.basename(path))
            warnings.warn(
                f"checkpoint_callbacks: no readable backup in "
                f"{literal(self.backup_dir)}; resuming from {literal(path)} "
                "(its random-generator states were not saved).",
                UserWarning, stacklevel=2,
            )
            return {"epoch": epochs, "steps": batches}
        return None

    def _restore_random_state(self, saved):
        variables = _random_state_variables(self.model)
        for name, value in saved.items():
            if name in variables:
                variables[name].assign(np.asarray(value, "uint32").astype(
                    variables[name].dtype))

    def _save_model(self):
        self._trained_since_save = 0
        if not writes_checkpoints(self.model):
            # The chief writes; the others read the same directory.
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        version = max(self._version, self._newest_version()) + 1
        name = f"weights-{version}.weights.h5"
        weights = os.path.join(self.backup_dir, name)
        state = {
            "epoch": self._current_epoch,
            "batch": max(self._trained_in_epoch - 1, 0),
            "steps": self._trained_in_epoch,
            "weights": name,
            "version": version,
            "random": {k: np.asarray(v.numpy()).tolist() for k, v in
                       _random_state_variables(self.model).items()},
        }
        state_path = os.path.join(self.backup_dir, f"state-{version}.json")
        written = []
        try:
            _write_atomically(weights, lambda temp: save_weights_file(
                self.model, temp), written)
            _write_atomically(state_path, lambda temp: _dump(state, temp),
                              written)
            _write_atomically(self._training_metadata_path,
                              lambda temp: _dump(state, temp), written)
        except OSError as error:
            raise write_error(error, self.backup_dir) from error
        self._version = version
        self._weights_path = weights
        self._prune_states(keep=(version, version - 1))

    def _newest_version(self):
        if not os.path.isdir(self.backup_dir):
            return 0
        versions = [int(m[1]) for m in map(_STATE_PATTERN.match,
                                            os.listdir(self.backup_dir)) if m]
        return max(versions, default=0)

    def _prune_states(self, keep):
        for name in os.listdir(self.backup_dir):
            match = _STATE_PATTERN.match(name) or _WEIGHTS_PATTERN.match(name)
            if match and int(match[1]) not in keep:
                _remove_quietly(os.path.join(self.backup_dir, name))


def _warn_if_steps_per_execution(model, save_freq):
    """Warns when a mid-epoch resume cannot be step-exact."""
    steps = getattr(model, "steps_per_execution", 1) or 1
    if save_freq == "epoch" or int(steps) <= 1:
        return
    warnings.warn(
        f"checkpoint_callbacks({setting('save_freq', save_freq)}) with a "
        f"model compiled with {setting('steps_per_execution', int(steps))}: "
        "callbacks see one batch end per execution of "
        f"{int(steps)} batches, so checkpoints are taken every {save_freq} "
        "executions and a run resumed in the middle of an epoch does not "
        "continue at the exact batch. Compile with "
        f"{setting('steps_per_execution', 1)} for step-exact resumes, or "
        f"checkpoint with {setting('save_freq', 'epoch')} (a resume then "
        "starts at the interrupted epoch's first batch).",
        UserWarning, stacklevel=3,
    )


def _lock_file(handle):
    """Locks an open file without waiting; False if another process holds it.

    `flock` (Linux, macOS, BSD) and `msvcrt.locking` (Windows) locks belong
    to the open file: the operating system drops them when the process
    ends, however it ends (SIGKILL, OOM killer, power-off of a node that
    held an NFS lock once its lease expires), so a killed run never blocks
    the next one.

    Raises:
        OSError: when the file system does not support locks.
    """
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        # Lock one byte past the holder's record, so that others can read
        # it (Windows locks are mandatory); a lock beyond the end of a file
        # is allowed.
        handle.seek(1 << 20)
        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        finally:
            handle.seek(0)
        return True
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


def _unlock_file(handle):
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        handle.seek(1 << 20)
        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        except OSError:
            pass
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class WriterLock:
    """The lock of the one process that writes a checkpoint directory.

    Two runs training into one `checkpoint_dir` would interleave their
    states, and a resumed run would restore them as one. The writing
    process holds an exclusive lock on `checkpoint_dir/.writer.lock` (see
    `_lock_file`) from `checkpoint_callbacks` to the end of training, and
    writes its pid, host and start time into the file for the message
    another process gets. The lock is per process: the same process may
    take it again (a second `fit`, a script re-run in one R session); the
    operating system releases it when the process ends, even when killed.
    In multi-worker training only the chief takes it; the other workers
    read the directory. Readers (`make_or_restore_model`) take no lock.

    Args:
        directory: The checkpoint directory (it exists).
    """

    def __init__(self, directory):
        self.directory = directory
        self.path = os.path.join(directory, _LOCK)
        self._handle = None

    @property
    def held(self):
        """Whether this process holds the lock now."""
        return self._handle is not None

    def acquire(self):
        """Takes the lock; does nothing if this process holds it already.

        Raises:
            ValueError: if another process holds it.
        """
        if self._handle is not None:
            return
        handle = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644),
                           "r+b")
        try:
            locked = _lock_file(handle)
        except OSError as error:
            handle.close()
            warnings.warn(
                f"checkpoint_callbacks: the file system of "
                f"{literal(self.directory)} does not support file locks "
                f"({error.strerror or error}); another run writing into the "
                "same directory would not be detected.",
                UserWarning, stacklevel=3,
            )
            return
        if not locked:
            holder = _holder(handle)
            handle.close()
            raise ValueError(_held_message(self.directory, holder))
        handle.truncate(0)
        handle.write(json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.datetime.now().astimezone().isoformat(
                timespec="seconds"),
        }).encode("utf-8"))
        handle.flush()
        self._handle = handle

    def release(self):
        """Releases the lock if this process holds it."""
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                _unlock_file(handle)
            finally:
                handle.close()

    def __del__(self):
        self.release()


def _holder(handle):
    try:
        handle.seek(0)
        return json.loads(handle.read(4096).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}


def _held_message(directory, holder):
    who = "another process"
    if isinstance(holder, dict) and holder.get("pid"):
        who = f"process {holder['pid']}"
        if holder.get("host"):
            who += f" on {holder['host']}"
        if holder.get("since"):
            who += f" (since {holder['since']})"
    return (
        f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
        f"{who} is training into. Two runs writing one checkpoint directory "
        f"interleave their checkpoints, and "
        f"{api('make_or_restore_model')} would restore them as one run. "
        "Wait for that run to finish (or stop it) and run again to resume "
        "it, or give this run its own checkpoint_dir. The lock is released "
        "when that process ends, even if it is killed."
    )


# One lock per directory and process, shared by every callback set on it.
_WRITER_LOCKS = weakref.WeakValueDictionary()


def writer_lock(directory):
    """The process's `WriterLock` for `directory` (one per directory).

    Args:
        directory: An existing checkpoint directory.

    Returns:
        A `WriterLock`, alive as long as a callback holds it.
    """
    key = os.path.normcase(os.path.realpath(directory))
    lock = _WRITER_LOCKS.get(key)
    if lock is None:
        lock = WriterLock(directory)
        _WRITER_LOCKS[key] = lock
    return lock


class _NamedBuffer(io.BytesIO):
    """An in-memory file that `model.save_weights` accepts as `name`."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def __str__(self):
        return self.name


def save_weights_file(model, path):
    """Writes `model.save_weights(...)`'s content to `path`.

    The model's own `save_weights` (parallel models save their template)
    writes into memory, and the bytes reach the disk through plain Python
    I/O: when the disk fills up, h5py's own writer leaves a half-closed file
    whose later clean-up crashes the interpreter (segmentation fault at
    exit), whereas a Python write raises `OSError` and leaves nothing open.
    Keras's `H5IOStore` writes to an `io.BytesIO` for exactly this kind of
    use.

    Args:
        model: A built `keras.Model`.
        path: The `.weights.h5` file to write.
    """
    buffer = _NamedBuffer(os.fspath(path))
    model.save_weights(buffer, overwrite=True)
    with open(path, "wb") as f:
        f.write(buffer.getbuffer())
        f.flush()


def write_error(error, path):
    """The `OSError` to raise when writing a checkpoint to `path` failed."""
    return OSError(
        error.errno,
        f"checkpoint_callbacks could not write the checkpoint "
        f"{literal(os.fspath(path))} ({error.strerror or error}); the "
        "committed checkpoints are intact and the partial file was removed. "
        "Free disk space (or choose another checkpoint_dir) and run again to "
        "resume.",
    )


def _dump(state, path):
    with open(path, "w") as f:
        json.dump(state, f)


def _write_atomically(path, write, written):
    """Writes `path` through a temporary file; removes it if writing fails."""
    temp = _temp_path(path)
    try:
        write(temp)
        _commit(temp, path)
    except BaseException:
        _remove_quietly(temp)
        raise
    written.append(path)


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _check_max_to_keep(max_to_keep):
    if max_to_keep is None:
        return None
    return check_int("max_to_keep", max_to_keep, 1, expected=(
        "an int >= 1 (keep that many newest ckpt-*.keras models) or "
        f"{literal(None)} (keep all)"))


def _check_creatable(directory):
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
            f"cannot be created ({type(error).__name__}: {error.strerror}); "
            "expected a directory path whose parents are directories."
        ) from None


def _check_writable(directory):
    _check_creatable(directory)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
            "this process cannot write to; checked before training so no "
            "epoch is lost. Choose a writable directory or fix its "
            "permissions."
        )


def _check_backup_path(directory):
    backup = os.path.join(directory, _BACKUP)
    if os.path.exists(backup) and not os.path.isdir(backup):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
            f"holds a file named {literal(_BACKUP)} where checkpoint_callbacks "
            "keeps the training state (a directory of that name); checked "
            "before training so no epoch is lost. Move or rename that file, "
            "or choose another checkpoint_dir."
        )


def checkpoint_callbacks(checkpoint_dir, save_freq="epoch",
                         max_to_keep=DEFAULT_MAX_TO_KEEP):
    """Keras callbacks that checkpoint training and resume it exactly.

    Pass them to `fit` (or `fit_distributed`) and run the same script again
    after a failure: training resumes at the step after the last committed
    checkpoint, with the weights, optimizer state and random-generator
    states of that checkpoint, and skips the batches of the interrupted
    epoch that were already trained, so it ends with the weights an
    uninterrupted run would have (when the data's order depends only on the
    epoch, e.g. unshuffled data or `distributed_dataset(..., seed=...)`; a
    warning at the start says when it does not). Once training has
    finished, running the script again trains nothing.

    Args:
        checkpoint_dir: Directory for the checkpoints (created if missing):
            `ckpt-{epoch}.keras` full models at every epoch end (and
            `ckpt-{epoch}-{batch}.keras` in between with a batch frequency)
            and the `backup/` training state. One process writes it at a
            time: the callbacks hold a lock on it from this call to the end
            of training, which the operating system releases when the
            process ends, even if it is killed.
        save_freq: `"epoch"` to checkpoint at the end of every epoch, or an
            int N to checkpoint every N batches (counted from each epoch's
            start) and at every epoch end. A mid-epoch resume is exact with
            a model compiled with `steps_per_execution=1` (warned about
            otherwise).
        max_to_keep: How many of the newest `ckpt-*.keras` models to keep
            (as TensorFlow's `tf.train.CheckpointManager`); None keeps all.
            The `backup/` state always keeps the newest and previous state.

    Returns:
        A list `[BackupAndRestore, ModelCheckpoint]` of Keras callbacks (the
        atomic subclasses of this module). In multi-worker training only
        the chief writes; every worker restores from the same directory.

    Raises:
        ValueError: for an invalid `checkpoint_dir`, `save_freq` or
            `max_to_keep`, a directory this process cannot write, one that
            holds a file named `backup`, or one another process is training
            into.

    Example:
    >>> with strategy.scope():
    ...     model = multigpu.make_or_restore_model("ckpt", build_model)
    >>> model.fit(data, epochs=10,
    ...           callbacks=multigpu.checkpoint_callbacks("ckpt"))
    """
    directory = _check_directory(checkpoint_dir)
    save_freq = _check_save_freq(save_freq)
    max_to_keep = _check_max_to_keep(max_to_keep)
    _check_writable(directory)
    _check_backup_path(directory)
    lock = None
    if cluster_lib.is_chief():
        lock = writer_lock(directory)
        lock.acquire()
        _remove_stale_temporaries(directory)
    epoch_name = "ckpt-{epoch}.keras"
    name = epoch_name if save_freq == "epoch" else "ckpt-{epoch}-{batch}.keras"
    position = ResumePosition()
    return [
        AtomicBackupAndRestore(os.path.join(directory, _BACKUP),
                               save_freq=save_freq, position=position,
                               lock=lock),
        AtomicModelCheckpoint(os.path.join(directory, name),
                              save_freq=save_freq, max_to_keep=max_to_keep,
                              position=position,
                              epoch_filepath=os.path.join(directory,
                                                          epoch_name)),
    ]


def checkpoint_position(name):
    """(epochs completed, batches into the next) for a checkpoint file name.

    `ckpt-3.keras` is saved after epoch 3; `ckpt-3-5.keras` after batch 5 of
    epoch 3, so after 2 complete epochs and 5 batches.

    Args:
        name: A file name matching `ckpt-E.keras` or `ckpt-E-B.keras`.

    Returns:
        A tuple of two ints.
    """
    match = CHECKPOINT_PATTERN.match(name)
    epoch, batch = int(match[1]), match[2]
    return (epoch, 0) if batch is None else (epoch - 1, int(batch))


def list_checkpoints(checkpoint_dir):
    """The `ckpt-*.keras` files of a directory, newest first.

    Newest means furthest in training, by the epoch and batch in the file
    name (modification times change with copies and `touch`; a resumed run
    never writes a smaller position than an older file's).

    Args:
        checkpoint_dir: A directory written by `checkpoint_callbacks`.

    Returns:
        A list of paths, newest first (empty if the directory does not
        exist).
    """
    if not os.path.isdir(checkpoint_dir):
        return []
    names = [n for n in os.listdir(checkpoint_dir)
             if CHECKPOINT_PATTERN.match(n)]
    names.sort(key=checkpoint_position, reverse=True)
    return [os.path.join(checkpoint_dir, n) for n in names]


def prune_checkpoints(checkpoint_dir, max_to_keep):
    """Deletes all but the `max_to_keep` newest `ckpt-*.keras` files.

    Args:
        checkpoint_dir: A directory written by `checkpoint_callbacks`.
        max_to_keep: An int >= 1, or None to keep all.

    Returns:
        The paths deleted.
    """
    if max_to_keep is None:
        return []
    stale = list_checkpoints(checkpoint_dir)[max_to_keep:]
    for path in stale:
        _remove_quietly(path)
    return stale


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
        ValueError: for an invalid `checkpoint_dir`, or if `build_fn`
            returns a model that is not compiled.
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
    _check_creatable(directory)
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
    if not getattr(model, "compiled", False):
        raise ValueError(
            f"Invalid `build_fn`: it returned the model {literal(model.name)}, "
            "which is not compiled; a restored checkpoint is compiled (with "
            "its optimizer state), so the new model must be too. Call "
            "model.compile(optimizer=..., loss=...) in build_fn before "
            "returning the model."
        )
    return model
