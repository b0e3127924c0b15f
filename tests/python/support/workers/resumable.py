"""Strategy-scoped training that checkpoints every epoch and resumes.

Usage: resumable.py CKPT_DIR OUT_NPZ [--pause-at EPOCH BATCH]

With --pause-at, prints PAUSED after that batch and sleeps, to be killed.
"""

import argparse
import time

import _common

import multigpu

multigpu.virtual_devices(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from models import mlp  # noqa: E402

EPOCHS = 4


class Report(keras.callbacks.Callback):
    def __init__(self, pause_at):
        super().__init__()
        self.pause_at = tuple(pause_at) if pause_at else None
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        print(f"epoch-begin {epoch}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.pause_at:
            print("PAUSED", flush=True)
            time.sleep(600)


def build():
    keras.utils.set_random_seed(1234)
    model = mlp()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("--pause-at", nargs=2, type=int)
    options = parser.parse_args()
    strategy = multigpu.mirrored_strategy()
    with strategy.scope():
        model = multigpu.make_or_restore_model(options.checkpoint_dir, build)
    x, y = _common.training_data()
    data = multigpu.distributed_dataset(x, y, per_replica_batch_size=8,
                                        strategy=strategy)
    callbacks = multigpu.checkpoint_callbacks(options.checkpoint_dir)
    model.fit(data, epochs=EPOCHS, verbose=0,
              callbacks=callbacks + [Report(options.pause_at)])
    np.savez(options.out, *model.get_weights())
    print("finished", flush=True)


if __name__ == "__main__":
    main()
