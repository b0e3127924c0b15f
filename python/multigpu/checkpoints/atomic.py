"""Atomic file writes: a checkpoint file is either complete or absent.

Every file is written under a hidden temporary name in its own directory,
flushed to disk, and renamed into place (`os.replace`, atomic on POSIX and
Windows), so a process killed at any moment (SIGKILL, OOM killer,
preemption) leaves either the old file or the new one, never a torn one.
"""

import glob
import io
import json
import os

from multigpu.messages import literal

TEMP_PREFIX = ".tmp-"


def temp_path(path):
    """A hidden sibling of `path` with the same extension.

    Example:
    >>> temp_path("ckpt/ckpt-1.keras")  # doctest: +SKIP
    'ckpt/.tmp-4242-ckpt-1.keras'
    """
    directory, name = os.path.split(path)
    return os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{name}")


def commit(temp, path):
    """Flushes `temp` to disk and renames it to `path` (atomic on POSIX)."""
    with open(temp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(temp, path)


def remove_quietly(path):
    """Deletes `path` if it exists; a file already gone is no error."""
    try:
        os.remove(path)
    except OSError:
        pass


def remove_stale_temporaries(directory):
    """Deletes the temporary files a killed process left in `directory`."""
    for path in glob.glob(os.path.join(glob.escape(directory), TEMP_PREFIX + "*")):
        remove_quietly(path)


def write_atomically(path, write, written):
    """Writes `path` through a temporary file; removes it if writing fails.

    Args:
        path: The file to write.
        write: A function of one argument, the temporary path to write.
        written: A list; `path` is appended once it is committed.
    """
    temp = temp_path(path)
    try:
        write(temp)
        commit(temp, path)
    except BaseException:
        remove_quietly(temp)
        raise
    written.append(path)


def dump_json(state, path):
    """Writes `state` to `path` as JSON."""
    with open(path, "w") as f:
        json.dump(state, f)


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
    """The `OSError` to raise when writing a checkpoint to `path` failed.

    Args:
        error: The `OSError` the write raised.
        path: The file or directory being written.

    Returns:
        An `OSError` with the same errno, saying what is intact and the fix.
    """
    return OSError(
        error.errno,
        f"checkpoint_callbacks could not write the checkpoint "
        f"{literal(os.fspath(path))} ({error.strerror or error}); the "
        "committed checkpoints are intact and the partial file was removed. "
        "Free disk space (or choose another checkpoint_dir) and run again to "
        "resume.",
    )
