"""mirrored_strategy() on a machine with one device: one replica, fit works."""

import _common
import numpy as np
from models import mlp

import multigpu

strategy = multigpu.mirrored_strategy()
with strategy.scope():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
x, y = _common.training_data()
data = multigpu.distributed_dataset(x, y, 8, strategy=strategy)
history = model.fit(data, epochs=1, verbose=0)
print(f"replicas={strategy.num_replicas_in_sync}")
print(f"devices={list(strategy.extended.worker_devices)}")
print(f"batch={next(iter(data))[0].shape[0]}")
print(f"finite={bool(np.isfinite(history.history['loss'][0]))}")
