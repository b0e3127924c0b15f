"""How long a block of code left this whole process asleep.

A stall (every thread waiting on a timer or on each other, as a freed
tf.data iterator waits for its autotuning thread) and a busy machine both
make code slow; only the stall leaves no thread of the process running or
waiting for a core. `IdleTime` tells them apart by sampling the state of
every thread of the process from /proc (Linux).
"""

import os
import threading
import time

_TASKS = "/proc/self/task"
# Running, runnable, or in uninterruptible (disk) sleep: not a timer stall.
_BUSY_STATES = frozenset("RD")


def _thread_state(tid):
    try:
        with open(f"{_TASKS}/{tid}/stat") as stat:
            # The state follows the command name, which may hold ") ".
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None  # the thread ended while sampled


def any_thread_busy(skip):
    """Whether a thread of this process other than `skip` runs or can run.

    Args:
        skip: The native id of a thread to leave out (the sampler's own).

    Returns:
        True if some thread is running or runnable.
    """
    main = str(threading.main_thread().native_id)
    tids = os.listdir(_TASKS)
    # The main thread first: during a fit it is the one most often running.
    for tid in sorted(tids, key=lambda t: t != main):
        if tid != str(skip) and _thread_state(tid) in _BUSY_STATES:
            return True
    return False


class IdleTime:
    """Times a block: its wall time and the part of it the process slept.

    A background thread looks at every thread of the process every
    `interval` seconds; the time since its previous look counts as idle
    when no other thread was running or runnable. Threads that wait for a
    core on a loaded machine are runnable, so load does not count.

    Attributes:
        wall: Seconds the block took.
        idle: Seconds of it with the whole process asleep, or None where
            /proc has no per-thread states (not Linux).

    Example:
    >>> with IdleTime() as timing:
    ...     time.sleep(0.5)
    >>> timing.idle > 0.4
    True
    """

    def __init__(self, interval=0.02):
        self.interval = interval
        self.wall = None
        self.idle = None

    def __enter__(self):
        self._stop = threading.Event()
        self._sampler = None
        if os.path.isdir(_TASKS):
            self.idle = 0.0
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._start
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        return False

    def _sample(self):
        own = threading.get_native_id()
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            busy = any_thread_busy(own)
            now = time.perf_counter()
            if not busy:
                self.idle += now - last
            last = now
