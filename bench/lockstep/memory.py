"""Peak memory of a benchmark process (Python- or R-driven)."""

import resource
import sys


def peak_rss_mib():
    """Peak resident memory of this process so far, in MiB.

    `ru_maxrss` of `RUSAGE_SELF`: for an R-driven run, the R process that
    hosts Python.
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def peak_device_mib(device_names):
    """Sum of the allocator peaks of the GPUs in `device_names`, in MiB.

    Returns:
        The sum of `tf.config.experimental.get_memory_info(...)["peak"]`
        over the GPUs in the list, or None when it holds no GPU (CPU memory
        is in `peak_rss_mib`).
    """
    import tensorflow as tf

    gpus = [d for d in device_names if ":GPU:" in d.upper()]
    if not gpus:
        return None
    peaks = [tf.config.experimental.get_memory_info(d.split("device:")[-1])
             for d in gpus]
    return sum(p["peak"] for p in peaks) / 2**20


def lock_memory():
    """Keeps this process's memory resident while it waits for its turn.

    Workers idle for tens of seconds while the others run their epochs.
    Kernels that reclaim cold pages proactively (DAMON's `pageout`, as on
    this project's benchmark VM) then drop the idle workers' file-backed
    pages (TensorFlow's code), and the next epoch stalls on page faults:
    seconds of wall time with no CPU time, which has nothing to do with
    the configuration measured. `mlockall(MCL_CURRENT | MCL_FUTURE |
    MCL_ONFAULT)` locks pages as they are touched, so nothing new is
    allocated, only the working set is kept.

    Returns:
        An empty string when memory is locked, else why not (no Linux, or
        not permitted: locking needs CAP_IPC_LOCK or a high enough
        `ulimit -l`).
    """
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return "memory locking is Linux-only"
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    mcl_current, mcl_future, mcl_onfault = 1, 2, 4
    if libc.mlockall(mcl_current | mcl_future | mcl_onfault) != 0:
        import os

        return f"mlockall failed: {os.strerror(ctypes.get_errno())}"
    return ""
