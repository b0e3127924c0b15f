"""The single writer of a checkpoint directory: the chief, holding a file lock.

Two runs training into one `checkpoint_dir` would interleave their states,
and a resumed run would restore them as one. `WriterLock` lets one process
write a directory at a time, and `writes_checkpoints` says whether this
process is the one that writes in multi-worker training (the chief).
"""

import datetime
import errno
import json
import os
import socket
import warnings
import weakref

from multigpu.cluster import resolver as cluster_lib
from multigpu.messages import api, literal

LOCK_NAME = ".writer.lock"


def writes_checkpoints(model):
    """Whether this process writes checkpoints while training `model`.

    Asks the model's strategy (`extended.should_checkpoint`, False on the
    non-chief workers of a `MultiWorkerMirroredStrategy`), then `TF_CONFIG`.

    Args:
        model: The `keras.Model` being trained.

    Returns:
        A bool.

    Example:
    >>> writes_checkpoints(model)   # one process, or the chief
    True
    """
    strategy = getattr(model, "distribute_strategy", None)
    should = getattr(getattr(strategy, "extended", None),
                     "should_checkpoint", True)
    return bool(should) and cluster_lib.is_chief()


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
        self.path = os.path.join(directory, LOCK_NAME)
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
