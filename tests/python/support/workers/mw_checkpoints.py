"""Multi-worker training with checkpoints every 2 batches; resumable.

Usage: python -m multigpu.launch --workers 2 mw_checkpoints.py CKPT OUT_DIR
           [--kill-worker INDEX --at-step STEP] [--warn-launcher-at-step STEP]

With --kill-worker, that worker SIGKILLs itself after global step STEP (the
launcher then stops the others); run again without it to resume. With
--warn-launcher-at-step, worker 0 sends its parent, the launcher, SIGUSR1
after global step STEP, as Slurm warns a batch shell before its time
limit.
"""

import argparse
import os
import signal

import _common
import keras
import numpy as np
from models import mlp

import multigpu

EPOCHS = 4


def build():
    keras.utils.set_random_seed(1234)
    model = mlp()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--kill-worker", type=int)
    parser.add_argument("--at-step", type=int)
    parser.add_argument("--save-freq", default="2")
    parser.add_argument("--warn-launcher-at-step", type=int)
    options = parser.parse_args()
    save_freq = options.save_freq
    save_freq = int(save_freq) if save_freq.isdigit() else save_freq
    strategy = multigpu.multi_worker_strategy()
    index = _common.worker_index()
    with strategy.scope():
        model = multigpu.make_or_restore_model(options.checkpoint_dir, build)
    x, y = _common.training_data(64)
    data = multigpu.distributed_dataset(x, y, 8, strategy=strategy)
    callbacks = multigpu.checkpoint_callbacks(options.checkpoint_dir,
                                              save_freq=save_freq)
    if options.kill_worker == index:
        callbacks.append(_common.signal_at_step(
            options.at_step, signal.SIGKILL,
            say=f"killing myself after step {options.at_step}"))
    if options.warn_launcher_at_step and index == 0:
        callbacks.append(_common.signal_at_step(
            options.warn_launcher_at_step, signal.SIGUSR1, pid=os.getppid()))
    multigpu.fit_distributed(model, data, epochs=EPOCHS, verbose=0,
                             callbacks=callbacks)
    np.savez(os.path.join(options.out_dir, f"weights-{index}.npz"),
             *model.get_weights())
    print(f"worker {index} done", flush=True)


if __name__ == "__main__":
    main()
