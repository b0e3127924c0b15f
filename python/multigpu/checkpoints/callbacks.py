"""`checkpoint_callbacks`: the two callbacks that make training resumable."""

import os

from multigpu import backends
from multigpu.checkpoints import preemption
from multigpu.checkpoints.arguments import (
    BACKUP_NAME,
    check_backup_path,
    check_directory,
    check_max_to_keep,
    check_save_freq,
    check_writable,
)
from multigpu.checkpoints.atomic import remove_stale_temporaries
from multigpu.checkpoints.backup import (
    RESUME_BACKENDS,
    RESUME_NEEDS,
    AtomicBackupAndRestore,
)
from multigpu.checkpoints.lock import writer_lock
from multigpu.checkpoints.model_checkpoint import AtomicModelCheckpoint
from multigpu.checkpoints.resume import ResumePosition
from multigpu.cluster import resolver as cluster_lib

DEFAULT_MAX_TO_KEEP = 3


def checkpoint_callbacks(checkpoint_dir, save_freq="epoch",
                         max_to_keep=DEFAULT_MAX_TO_KEEP, data=None,
                         preemption_signal=preemption.DEFAULT_SIGNAL):
    """Keras callbacks that checkpoint training and resume it exactly.

    Pass them to `fit` (or `fit_distributed`) and run the same script again
    after a failure: training resumes at the step after the last committed
    checkpoint, with the weights, optimizer state and random-generator
    states of that checkpoint, and skips the batches of the interrupted
    epoch that were already trained, so it ends with the weights an
    uninterrupted run would have, when the data's order depends only on the
    epoch: unshuffled data, or a `distributed_dataset(..., shuffle=True,
    seed=...)` given as `data` (a warning at the start says when the data
    given cannot be replayed). Once training has finished, running the
    script again trains nothing.

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
        data: The training `tf.data.Dataset`, or None. A dataset from
            `distributed_dataset(shuffle=True, seed=...)` owns the count of
            its epochs; given here, it is told each epoch, so a resumed
            epoch is shuffled as the interrupted one was. `fit_distributed`
            gives its dataset itself.
        preemption_signal: The signal a scheduler sends before it stops the
            job (Slurm: `sbatch --signal=B:USR1@90`), by name or number, or
            None to leave it alone. When it arrives during `fit`, the batch
            in progress ends, the exact training state is saved after it,
            a Slurm job submitted with `--requeue` is requeued
            (`scontrol requeue`), and the process exits with status 75
            (`preemption.PREEMPTED_EXIT_STATUS`) and a message saying how
            it resumes; running the script again continues at that batch.
            Multi-worker jobs stop together after the same batch.

    Returns:
        A list `[AtomicBackupAndRestore, AtomicModelCheckpoint]` of Keras
        callbacks. In multi-worker training only the chief writes; every
        worker restores from the same directory.

    Raises:
        ValueError: for an invalid `checkpoint_dir`, `save_freq`,
            `max_to_keep` or `preemption_signal` (no signal here, or one no
            process can catch), a directory this process cannot write, one
            that holds a file named `backup`, or one another process is
            training into.
        TypeError: if `data` is not a `tf.data.Dataset` or None, or
            `preemption_signal` no signal name or number.

    Example:
    >>> with strategy.scope():
    ...     model = multigpu.make_or_restore_model("ckpt", build_model)
    >>> model.fit(data, epochs=10,
    ...           callbacks=multigpu.checkpoint_callbacks("ckpt", data=data))
    """
    backends.require_backend("checkpoint_callbacks", RESUME_NEEDS,
                             RESUME_BACKENDS)
    directory = check_directory(checkpoint_dir)
    save_freq = check_save_freq(save_freq)
    max_to_keep = check_max_to_keep(max_to_keep)
    check_writable(directory)
    check_backup_path(directory)
    signum = preemption.check_preemption_signal(preemption_signal)
    lock = None
    if cluster_lib.is_chief():
        lock = writer_lock(directory)
        lock.acquire()
        remove_stale_temporaries(directory)
    epoch_name = "ckpt-{epoch}.keras"
    name = epoch_name if save_freq == "epoch" else "ckpt-{epoch}-{batch}.keras"
    position = ResumePosition()
    return [
        AtomicBackupAndRestore(os.path.join(directory, BACKUP_NAME),
                               save_freq=save_freq, position=position,
                               lock=lock, data=data,
                               preemption_signal=signum),
        AtomicModelCheckpoint(os.path.join(directory, name),
                              save_freq=save_freq, max_to_keep=max_to_keep,
                              position=position,
                              epoch_filepath=os.path.join(directory,
                                                          epoch_name)),
    ]
