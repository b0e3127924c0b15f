"""The worker-side epoch timer of the lockstep protocol (see `bench.lockstep.protocol`)."""

import faulthandler
import os
import resource
import sys
import threading
import time

import keras


def major_faults():
    """Page faults of this process that needed I/O, so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


class LockstepTimer(keras.callbacks.Callback):
    """Times each epoch once the orchestrator grants it.

    An epoch's time runs from the grant to the start of the next epoch (or
    the end of training), so it includes every epoch-end callback, such as
    the mirrored engine's copy of the weights back to the template. Each
    report has the wall-clock `seconds`, the `cpu_seconds` the process used
    meanwhile (all threads), which tells overhead from waiting, and the
    `major_faults` (page faults that waited for I/O) it took.

    Args:
        channel: The worker's `Channel`.
    """

    def __init__(self, channel):
        super().__init__()
        self._channel = channel
        self._started = None
        self._cpu_started = None
        self._faults_started = None
        self._epoch = None
        self._watchdog = None
        # Diagnostics: MULTIGPU_BENCH_WATCHDOG=<seconds> writes every
        # thread's Python stack to the log when an epoch runs longer.
        self._watchdog_seconds = float(
            os.environ.get("MULTIGPU_BENCH_WATCHDOG", "0"))

    def _report(self):
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._started is not None:
            seconds = time.perf_counter() - self._started
            cpu_seconds = time.process_time() - self._cpu_started
            faults = major_faults() - self._faults_started
            self._channel.send("epoch", index=self._epoch, seconds=seconds,
                               cpu_seconds=cpu_seconds, major_faults=faults)
            self._started = None

    def on_epoch_begin(self, epoch, logs=None):
        self._report()
        self._channel.wait()
        self._epoch = int(epoch)
        self._started = time.perf_counter()
        self._cpu_started = time.process_time()
        self._faults_started = major_faults()
        if self._watchdog_seconds > 0:
            self._watchdog = threading.Timer(
                self._watchdog_seconds, faulthandler.dump_traceback,
                kwargs={"file": sys.stderr, "all_threads": True})
            self._watchdog.daemon = True
            self._watchdog.start()

    def on_train_end(self, logs=None):
        self._report()
