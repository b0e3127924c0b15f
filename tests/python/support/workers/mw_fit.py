"""Multi-worker training with fit_distributed; saves weights and history.

Usage: python -m multigpu.launch --workers 2 mw_fit.py OUT_DIR
"""

import json
import os
import sys

import _common
import keras
import numpy as np
from models import mlp

import multigpu

PER_REPLICA = 8
EPOCHS = 3


def main(out_dir):
    strategy = multigpu.multi_worker_strategy()
    index = _common.worker_index()
    keras.utils.set_random_seed(1234)
    with strategy.scope():
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss="mse", metrics=["mae"])
    initial = [w.tolist() for w in model.get_weights()]
    x, y = _common.training_data()
    data = multigpu.distributed_dataset(
        x, y, per_replica_batch_size=PER_REPLICA, strategy=strategy)
    history = multigpu.fit_distributed(model, data, epochs=EPOCHS,
                                       verbose=2 if index == 0 else 0)
    np.savez(os.path.join(out_dir, f"weights-{index}.npz"),
             *model.get_weights())
    with open(os.path.join(out_dir, f"run-{index}.json"), "w") as f:
        json.dump({"history": history.history, "initial": initial,
                   "replicas": strategy.num_replicas_in_sync,
                   "global_batch": PER_REPLICA * strategy.num_replicas_in_sync},
                  f)
    print(f"worker {index} done")


if __name__ == "__main__":
    main(sys.argv[1])
