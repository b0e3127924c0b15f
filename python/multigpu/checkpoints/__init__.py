"""Fault tolerance: checkpoint every epoch (or N batches), resume exactly.

`checkpoint_callbacks(checkpoint_dir)` gives two Keras callbacks:

* `AtomicBackupAndRestore` keeps the training state in
  `checkpoint_dir/backup`: weights and optimizer state, the epoch and the
  batches trained in it, and the seed-generator states. A restarted `fit`
  (or `fit_distributed`) restores it, resumes at that epoch and skips the
  batches already trained (its train function draws them without training),
  so it continues exactly where the killed run committed. A corrupt state
  falls back to the previous one, then to the newest `ckpt-*.keras`.
* `AtomicModelCheckpoint` writes full models,
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

The modules, lowest level first: `atomic` (atomic writes), `lock` (the
single writer), `listing` (the models of a directory, pruning), `arguments`
(argument checks), `resume` (the resume state), `backup` and
`model_checkpoint` (one callback each), `callbacks` and `restore` (the two
entry points).
"""

from multigpu.checkpoints.atomic import save_weights_file, write_error
from multigpu.checkpoints.backup import AtomicBackupAndRestore
from multigpu.checkpoints.callbacks import DEFAULT_MAX_TO_KEEP, checkpoint_callbacks
from multigpu.checkpoints.listing import (
    CHECKPOINT_PATTERN,
    checkpoint_position,
    list_checkpoints,
    prune_checkpoints,
)
from multigpu.checkpoints.lock import WriterLock, writer_lock, writes_checkpoints
from multigpu.checkpoints.model_checkpoint import AtomicModelCheckpoint
from multigpu.checkpoints.restore import make_or_restore_model
from multigpu.checkpoints.resume import ResumePosition

__all__ = [
    "CHECKPOINT_PATTERN",
    "DEFAULT_MAX_TO_KEEP",
    "AtomicBackupAndRestore",
    "AtomicModelCheckpoint",
    "ResumePosition",
    "WriterLock",
    "checkpoint_callbacks",
    "checkpoint_position",
    "list_checkpoints",
    "make_or_restore_model",
    "prune_checkpoints",
    "save_weights_file",
    "write_error",
    "writer_lock",
    "writes_checkpoints",
]
