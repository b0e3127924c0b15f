"""Trains with checkpoint_callbacks and may SIGKILL itself at a chosen moment.

Usage: resume_exact.py PATH SAVE_FREQ CKPT_DIR OUT_NPZ
           [--kill-step N] [--kill-write N]

PATH is "multi_gpu_model", "mirrored" (model.fit under mirrored_strategy) or
"fit_distributed". --kill-step kills the process right after global training
step N; --kill-write kills it in the middle of the N-th checkpoint file write
of this run (after the temporary file is written, before it is committed).
Without a kill the run finishes and saves the final weights to OUT_NPZ.
"""

import argparse
import os
import signal

import _common

import multigpu

multigpu.virtual_devices(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from multigpu import checkpoints  # noqa: E402

EPOCHS = 3


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


class KillAtStep(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            _die()


def kill_inside_write(n):
    """Dies in the n-th commit: temporary file complete, not yet renamed."""
    real_commit = checkpoints.atomic.commit
    count = [0]

    def commit(temp, path):
        count[0] += 1
        if count[0] == n:
            _die()
        real_commit(temp, path)

    checkpoints.atomic.commit = commit


def build(devices=None):
    keras.utils.set_random_seed(1234)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.3)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    if devices:
        model = multigpu.multi_gpu_model(model, gpus=devices)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("save_freq")
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("--kill-step", type=int)
    parser.add_argument("--kill-write", type=int)
    options = parser.parse_args()
    keras.utils.set_random_seed(99)  # the data order depends on it
    save_freq = options.save_freq
    save_freq = int(save_freq) if save_freq.isdigit() else save_freq
    if options.kill_write:
        kill_inside_write(options.kill_write)
    x, y = _common.training_data(48)
    if options.path == "multi_gpu_model":
        model = build(devices=2)
        target = model
    else:
        strategy = multigpu.mirrored_strategy(2)
        with strategy.scope():
            model = multigpu.make_or_restore_model(options.checkpoint_dir,
                                                   build)
        target = strategy
    data = multigpu.distributed_dataset(x, y, 4, strategy=target,
                                        shuffle=True, seed=3)
    # fit_distributed gives the callbacks its dataset; fit cannot.
    given = None if options.path == "fit_distributed" else data
    callbacks = multigpu.checkpoint_callbacks(options.checkpoint_dir,
                                              save_freq=save_freq, data=given)
    if options.kill_step:
        callbacks.append(KillAtStep(options.kill_step))
    if options.path == "fit_distributed":
        multigpu.fit_distributed(model, data, epochs=EPOCHS, verbose=0,
                                 callbacks=callbacks)
    else:
        model.fit(data, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    np.savez(options.out, *model.get_weights())
    print("finished", flush=True)


if __name__ == "__main__":
    main()
