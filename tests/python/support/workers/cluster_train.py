"""One worker of a cluster (any cluster manager): trains, reports, saves.

Usage: cluster_train.py OUT_DIR [--epochs N] [--checkpoints DIR]
           [--slow-until-requeued SECONDS]

The worker's index comes from the strategy (TF_CONFIG or Slurm), never from
the environment directly. Prints `task I pid P epoch E` when each epoch
begins; at the end writes OUT_DIR/weights-I.npz and OUT_DIR/run-I.json.
"""

import argparse
import json
import os

import _common

import multigpu
from multigpu import checkpoints

# First, before TensorFlow starts: on GPU nodes it gives the task its GPUs.
strategy = multigpu.multi_worker_strategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from models import mlp  # noqa: E402

PER_REPLICA = 8


def build():
    keras.utils.set_random_seed(1234)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="mse", metrics=["mae"])
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoints")
    parser.add_argument("--slow-until-requeued", type=float)
    options = parser.parse_args()
    index = strategy.cluster_resolver.task_id or 0
    with strategy.scope():
        model = build()
    initial = [w.tolist() for w in model.get_weights()]
    x, y = _common.training_data()
    data = multigpu.distributed_dataset(
        x, y, per_replica_batch_size=PER_REPLICA, strategy=strategy)
    started = []

    def on_epoch_begin(epoch, logs=None):
        started.append(epoch)
        print(f"task {index} pid {os.getpid()} epoch {epoch}", flush=True)

    callbacks = [keras.callbacks.LambdaCallback(on_epoch_begin=on_epoch_begin)]
    if options.checkpoints:
        callbacks = multigpu.checkpoint_callbacks(options.checkpoints) + \
            callbacks
    if options.slow_until_requeued:
        callbacks.append(_common.slow_until_requeued(options.slow_until_requeued))
    history = multigpu.fit_distributed(model, data, epochs=options.epochs,
                                       verbose=0, callbacks=callbacks)
    np.savez(os.path.join(options.out_dir, f"weights-{index}.npz"),
             *model.get_weights())
    with open(os.path.join(options.out_dir, f"run-{index}.json"), "w") as f:
        json.dump({"history": history.history, "initial": initial,
                   "epochs_run": started,
                   "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                   "writes_checkpoints": checkpoints.writes_checkpoints(model),
                   "replicas": strategy.num_replicas_in_sync,
                   "global_batch": PER_REPLICA * strategy.num_replicas_in_sync},
                  f)
    print(f"task {index} done", flush=True)


if __name__ == "__main__":
    main()
