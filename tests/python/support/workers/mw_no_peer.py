"""Worker 1 never joins (and ignores SIGTERM); worker 0 waits for it."""

import signal
import time

import _common

if _common.worker_index() == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("worker 1 hangs before joining", flush=True)
    time.sleep(3600)

import multigpu

multigpu.multi_worker_strategy()
print("worker 0 joined a cluster that cannot exist", flush=True)
