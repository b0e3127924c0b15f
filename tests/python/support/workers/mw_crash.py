"""Worker 1 fails after joining the cluster; worker 0 trains on, waiting for it."""

import sys

import _common
from models import mlp

import multigpu

strategy = multigpu.multi_worker_strategy()
if _common.worker_index() == 1:
    print("worker 1 fails now", flush=True)
    sys.exit(3)
with strategy.scope():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
x, y = _common.training_data()
data = multigpu.distributed_dataset(x, y, 8, strategy=strategy)
multigpu.fit_distributed(model, data, epochs=100000, verbose=0)
