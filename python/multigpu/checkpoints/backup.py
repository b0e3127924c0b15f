"""The callback that saves the training state and resumes at the interrupted step."""

import os
import warnings

import keras

from multigpu import backends, internals
from multigpu.checkpoints import atomic, epochs, listing, preemption, resume
from multigpu.checkpoints.arguments import check_save_freq
from multigpu.checkpoints.lock import writes_checkpoints
from multigpu.cluster import agreement
from multigpu.inputs import is_dataset
from multigpu.messages import literal
from multigpu.step import train_function as chain

# What resuming exactly needs (`backends.require_backend`): the skipping
# train function is called as the TensorFlow and JAX trainers call it, with
# the data iterator last; Keras's torch trainer draws the batch itself.
RESUME_BACKENDS = ("tensorflow", "jax")
RESUME_NEEDS = ("a training loop that gives the train function the data "
                "iterator: resuming exactly skips the batches already "
                "trained by drawing them from it")


class AtomicBackupAndRestore(keras.callbacks.Callback):
    """Saves the training state atomically; a restart resumes at its step.

    What `keras.callbacks.BackupAndRestore` does, step-exact: every save
    writes a new weights file (weights and optimizer state) and a state file
    (epoch, batches trained in it, random-generator states), then commits
    both by atomically replacing `training_metadata.json`; the previous
    state is kept as a fallback and older ones deleted. A restart restores
    the newest readable state (warning about, and skipping, a corrupt one),
    resumes at its epoch and skips the batches already trained in it, so
    the rest of training sees the same batches, weights, optimizer and
    random state as an uninterrupted run would.

    Args:
        backup_dir: The directory of the training state.
        save_freq: `"epoch"` or an int N (also every N trained batches).
        position: The `ResumePosition` shared with the model checkpoint
            callback.
        lock: The `WriterLock` to hold while training, or None.
        data: The training `tf.data.Dataset`, or None. A dataset from
            `distributed_dataset(shuffle=True, seed=...)` is told each
            epoch, so a resumed epoch is shuffled as the interrupted one.
        preemption_signal: The signal that stops training early, or None
            (see `checkpoint_callbacks`): once it arrives, the batch in
            progress ends, the state is saved there, and the process exits
            (`preemption.stop_job`).

    Raises:
        TypeError: if `data` is not a `tf.data.Dataset` or None, or
            `preemption_signal` is no signal name or number.
        ValueError: for a `preemption_signal` that is no signal here or
            cannot be caught.

    Example:
    >>> callback = AtomicBackupAndRestore("ckpt/backup", data=data)
    >>> model.fit(data, epochs=5, callbacks=[callback])
    """

    def __init__(self, backup_dir, save_freq="epoch", position=None,
                 lock=None, data=None, preemption_signal=None):
        backends.require_backend(
            "AtomicBackupAndRestore", RESUME_NEEDS, RESUME_BACKENDS,
            written="multigpu.checkpoints.AtomicBackupAndRestore()")
        super().__init__()
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = check_save_freq(save_freq)
        self.writer_lock = lock
        self.position = position or resume.ResumePosition()
        self.data = None
        self._clock = None
        self._replay_warned = False
        self._current_epoch = 0
        self._trained_since_save = 0
        self._trained_in_epoch = 0
        self._resumed_epoch = None
        self._version = 0
        self._watch = preemption.PreemptionWatch(
            preemption.check_preemption_signal(preemption_signal))
        # From now, not from fit: a warning during the set-up is kept.
        self._watch.start()
        self._agree = None  # how the workers agree (`agreement.agreement`)
        self.set_data(data)

    def set_data(self, data):
        """Follows `data`, the dataset being trained on (None: none).

        Args:
            data: A `tf.data.Dataset` or None.

        Raises:
            TypeError: for anything else.
        """
        if data is not None and not is_dataset(data):
            raise TypeError(
                f"Invalid `data`: received an object of type "
                f"{type(data).__name__}; expected the training "
                "tf.data.Dataset (e.g. from distributed_dataset) or "
                f"{literal(None)}.")
        self.data = data
        self._clock = epochs.epoch_clock(data)

    def on_train_begin(self, logs=None):
        writes = writes_checkpoints(self.model)
        if writes and self.writer_lock is not None:
            # Released at the end of the last training; taken again here.
            self.writer_lock.acquire()
        if os.path.isdir(self.backup_dir) and writes:
            atomic.remove_stale_temporaries(self.backup_dir)
        self._warn_if_not_replayable()
        resume.warn_if_steps_per_execution(self.model, self.save_freq)
        self._watch.start()
        # Read once: on JAX, reading `self.model` syncs the trainer's state.
        self._agree = agreement.agreement(
            getattr(self.model, "distribute_strategy", None))
        state = self._restore()
        self.position.skip = 0
        self.position.skipped = False
        self._trained_since_save = 0
        self._current_epoch = 0
        if state is None:
            return
        self._current_epoch = int(state["epoch"])
        internals.set_initial_epoch(self.model, self._current_epoch)
        self.position.skip = int(state.get("steps", 0))
        self._resumed_epoch = self._current_epoch
        if self.position.skip:
            chain.link(self.model, "resume", self._skipping)

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch
        resumed = self._resumed_epoch == epoch
        self._trained_in_epoch = self.position.skip if resumed else 0
        if self._clock is not None:
            # Before the epoch's iteration starts: it shuffles by (seed, epoch).
            self._clock.announce(epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self.position.skipped:
            return
        self._trained_in_epoch += 1
        if self._watch.signum is not None and self._preempted():
            self._stop_preempted()
        if self.save_freq == "epoch":
            return
        self._trained_since_save += 1
        if self._trained_since_save >= self.save_freq:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        self._current_epoch = epoch + 1
        self._trained_in_epoch = 0
        self._resumed_epoch = None
        # Finished epochs are committed at every frequency: never replayed.
        self._save()

    def on_train_end(self, logs=None):
        self._watch.stop()
        chain.unlink(self.model, "resume")
        if self.writer_lock is not None:
            self.writer_lock.release()

    def _preempted(self):
        """Whether the watched signal arrived, here or on any other worker.

        Workers get the signal at slightly different moments; they agree
        after every batch (one all-reduce of a flag), so that all stop
        after the same batch and their collectives stay paired.
        """
        if self._agree is None:
            return self._watch.caught
        return self._agree(self._watch.caught)

    def _stop_preempted(self):
        """Saves the state after this batch, then requeues and exits."""
        self._save()
        if self._agree is not None:
            # No worker exits before the chief has committed the state.
            self._agree(False)
        self._watch.stop()
        preemption.stop_job(
            self._watch.signum,
            f"the training state after batch {self._trained_in_epoch} of "
            f"epoch {self._current_epoch + 1} in "
            f"{literal(self.backup_dir)}",
            requeues=writes_checkpoints(self.model))

    def _skipping(self, train_function):
        """The `"resume"` link: the resumed epoch's trained batches only draw."""
        return resume.skipping_train_function(train_function, self.model,
                                              self.position)

    def _warn_if_not_replayable(self):
        """Warns once when the followed data cannot be replayed exactly."""
        if self.data is None or self._replay_warned:
            return
        problem = epochs.replay_problem(self.data)
        if problem:
            self._replay_warned = True
            warnings.warn(
                "checkpoint_callbacks: the training data cannot be replayed "
                f"exactly ({problem}); a resumed run continues at the right "
                "step with the right weights, optimizer and random state, "
                "but with other batches than an uninterrupted run would see.",
                UserWarning, stacklevel=3,
            )

    def _restore(self):
        """Loads the newest readable state; returns its metadata or None."""
        if not self.model.built:
            raise ValueError(
                "checkpoint_callbacks: the model is not built, so there are "
                "no weights to restore the training state into. Build it "
                "before fit: give it a keras.Input, or call it on a batch.")
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        candidates = resume.state_paths(self.backup_dir)
        tried = set()
        for path in candidates:
            reading = path
            try:
                state = resume.read_state(path)
                weights = os.path.join(self.backup_dir, state["weights"])
                if weights in tried:
                    continue
                tried.add(weights)
                reading = weights
                self.model.load_weights(weights)
                resume.restore_random_state(self.model, state.get("random", {}))
            except Exception as error:  # noqa: BLE001 - fall back
                warnings.warn(
                    f"checkpoint_callbacks: skipping the unreadable backup "
                    f"file {literal(reading)} ({type(error).__name__}: "
                    f"{error}); falling back to an older state.",
                    UserWarning, stacklevel=2,
                )
                continue
            self._version = int(state.get("version", 0))
            return state
        return self._restore_from_models() if candidates else None

    def _restore_from_models(self):
        """Falls back to the newest readable `ckpt-*.keras` full model."""
        directory = os.path.dirname(os.path.abspath(self.backup_dir))
        for path in listing.list_checkpoints(directory):
            try:
                self.model.load_weights(path)
            except Exception as error:  # noqa: BLE001 - try the next one
                warnings.warn(
                    f"checkpoint_callbacks: skipping the unreadable "
                    f"checkpoint {literal(path)} ({type(error).__name__}).",
                    UserWarning, stacklevel=2,
                )
                continue
            epochs_done, batches = listing.checkpoint_position(
                os.path.basename(path))
            warnings.warn(
                f"checkpoint_callbacks: no readable backup in "
                f"{literal(self.backup_dir)}; resuming from {literal(path)} "
                "(its random-generator states were not saved).",
                UserWarning, stacklevel=2,
            )
            return {"epoch": epochs_done, "steps": batches}
        return None

    def _save(self):
        self._trained_since_save = 0
        if not writes_checkpoints(self.model):
            # The chief writes; the others read the same directory.
            return
        version = max(self._version,
                      resume.newest_version(self.backup_dir)) + 1
        resume.write_state(self.model, self.backup_dir, {
            "epoch": self._current_epoch,
            "batch": max(self._trained_in_epoch - 1, 0),
            "steps": self._trained_in_epoch,
            "version": version,
        })
        self._version = version
