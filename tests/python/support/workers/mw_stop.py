"""Worker 1 stops itself (SIGSTOP) after joining; worker 0 trains on.

With the argument `peer-fails`, worker 0 exits with code 5 after 2 s instead
(as a worker whose collectives time out would).
"""

import os
import signal
import sys
import time

import _common
from models import mlp

import multigpu

strategy = multigpu.multi_worker_strategy()
if _common.worker_index() == 1:
    print("worker 1 stops now", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
if "peer-fails" in sys.argv:
    time.sleep(2)
    sys.exit(5)
with strategy.scope():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
x, y = _common.training_data()
data = multigpu.distributed_dataset(x, y, 8, strategy=strategy)
multigpu.fit_distributed(model, data, epochs=100000, verbose=0)
