"""A JAX worker of a job of several processes: the same script as on one machine.

    python jax_processes.py OUT [other-batches | dies]
    python jax_processes.py OUT resume CHECKPOINT_DIR EPOCHS [WARN_AT_STEP]

Two logical CPU devices per process; `multi_gpu_model(model, gpus=None)`
spans every process's devices. Trains on batches that split evenly,
unevenly and leave devices without rows, then writes this process's
weights, history and predictions to `OUT-<process>.npz`. `other-batches`:
process 1 shuffles with another seed. `dies`: process 1 exits with 3 after
the first epoch. `resume`: `resumable_fit` with checkpoints in
CHECKPOINT_DIR up to EPOCHS epochs (process 0 writes them); with
WARN_AT_STEP, process 0 sends its parent, the launcher, SIGUSR1 after that
global step, as Slurm warns a batch shell before the time limit.
"""

import os
import signal
import sys

os.environ["KERAS_BACKEND"] = "jax"

import _common  # quiet, optional packages hidden

import multigpu

multigpu.virtual_devices(2)

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from jax_processes_model import fit_and_predict, resumable_fit  # noqa: E402

out = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "train"
index = jax.process_index()
print(f"process {index} of {jax.process_count()}, devices "
      f"{len(jax.devices())} ({len(jax.local_devices())} here)", flush=True)


class Dies(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if index == 1:
            print("process 1 dies now", flush=True)
            os._exit(3)


if mode == "resume":
    warn = ([_common.signal_at_step(int(sys.argv[5]), signal.SIGUSR1,
                                    pid=os.getppid())]
            if len(sys.argv) > 5 and index == 0 else [])
    weights, epochs = resumable_fit(None, int(sys.argv[4]), sys.argv[3],
                                    callbacks=warn)
    np.savez(f"{out}-{index}.npz", *weights, epochs=np.asarray(epochs))
    print(f"process {index} trained epochs {epochs}", flush=True)
    sys.exit(0)
callbacks = [Dies()] if mode == "dies" else []
shuffle_seed = 2 if mode == "other-batches" and index == 1 else None
weights, history, predictions = fit_and_predict(
    None, callbacks=callbacks, shuffle_seed=shuffle_seed)
np.savez(f"{out}-{index}.npz", *weights, history=np.asarray(history),
         predictions=predictions)
print(f"process {index} done", flush=True)
