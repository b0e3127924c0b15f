"""Trains with checkpoint_callbacks and may SIGKILL itself at a chosen moment.

Usage: resume_exact.py PATH SAVE_FREQ CKPT_DIR OUT_NPZ
           [--kill-step N] [--kill-write N] [--signal-step N]
           [--slow-until-requeued SECONDS]

PATH is "multi_gpu_model", "mirrored" (model.fit under mirrored_strategy),
"fit_distributed" or, with KERAS_BACKEND=jax, "jax" (multi_gpu_model on
NumPy arrays, which Keras's JAX trainer batches in order). --kill-step kills the process right after global training
step N; --kill-write kills it in the middle of the N-th checkpoint file write
of this run (after the temporary file is written, before it is committed);
--signal-step sends the process SIGUSR1, a scheduler's warning before it
stops a job, right after step N: checkpoint_callbacks save after the next
step and exit with status 75. --slow-until-requeued sleeps that long after
every step until Slurm has requeued the job (SLURM_RESTART_COUNT > 0), so
that the first allocation of a Slurm job reaches its time limit.
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
    parser.add_argument("--signal-step", type=int)
    parser.add_argument("--slow-until-requeued", type=float)
    options = parser.parse_args()
    keras.utils.set_random_seed(99)  # the data order depends on it
    save_freq = options.save_freq
    save_freq = int(save_freq) if save_freq.isdigit() else save_freq
    if options.kill_write:
        kill_inside_write(options.kill_write)
    x, y = _common.training_data(48)
    if options.path == "jax":
        model = build(devices=2)
        callbacks = multigpu.checkpoint_callbacks(options.checkpoint_dir,
                                                  save_freq=save_freq)
        _add_stops(callbacks, options)
        model.fit(x, y, batch_size=8, epochs=EPOCHS, shuffle=False,
                  verbose=0, callbacks=callbacks)
        _finish(model, options)
        return
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
    _add_stops(callbacks, options)
    if options.path == "fit_distributed":
        multigpu.fit_distributed(model, data, epochs=EPOCHS, verbose=0,
                                 callbacks=callbacks)
    else:
        model.fit(data, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    _finish(model, options)


def _add_stops(callbacks, options):
    """The callbacks that kill, warn or slow the run, as the options ask."""
    if options.kill_step:
        callbacks.append(_common.signal_at_step(options.kill_step, signal.SIGKILL))
    if options.slow_until_requeued:
        callbacks.append(_common.slow_until_requeued(options.slow_until_requeued))
    if options.signal_step:
        callbacks.append(_common.signal_at_step(options.signal_step, signal.SIGUSR1))


def _finish(model, options):
    np.savez(options.out, *model.get_weights())
    print("finished, restarts:", os.environ.get("SLURM_RESTART_COUNT", "0"),
          flush=True)


if __name__ == "__main__":
    main()
