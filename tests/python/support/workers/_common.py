"""Shared set-up of the worker scripts: quiet TensorFlow, the test models."""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Packages the test environment holds for other steps (scikit-learn for the
# demo and the benchmarks, JAX for the JAX engine, pandas for keras3 in R),
# which the workers never use. TensorFlow and Keras import each of them
# whenever it is installed: `import multigpu` takes 5.6 CPU-seconds with
# them and 3.5 without, and the suite starts about 55 such processes.
# Marked missing here, before TensorFlow, each worker starts as in an
# environment with the core's dependencies only (`pip install
# "multigpu[cpu]"`). A test process that imports this module has Keras
# loaded already and is left as it is.
OPTIONAL_PACKAGES = ("jax", "pandas", "scipy", "sklearn")
# A worker started on JAX (KERAS_BACKEND=jax) needs JAX, and Keras's JAX
# backend SciPy.
if os.environ.get("KERAS_BACKEND") == "jax":
    OPTIONAL_PACKAGES = ("pandas", "sklearn")


def hide_optional_packages(names=OPTIONAL_PACKAGES):
    """Makes `import name` raise ImportError for each of `names` not loaded.

    Args:
        names: top-level package names.

    Returns:
        The names hidden: none once Keras is loaded (hiding then would only
        break the modules that hold them already).

    Example:
        >>> hide_optional_packages(("sklearn",))  # in a fresh worker
        ('sklearn',)
    """
    if "keras" in sys.modules:
        return ()
    hidden = tuple(name for name in names if name not in sys.modules)
    for name in hidden:
        sys.modules[name] = None
    return hidden


hide_optional_packages()


def worker_index():
    """This worker's task index from TF_CONFIG (0 without TF_CONFIG)."""
    config = os.environ.get("TF_CONFIG")
    return json.loads(config)["task"]["index"] if config else 0


def training_data(rows=96):
    import numpy as np

    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, 8)).astype("float32")
    y = rng.standard_normal((rows, 3)).astype("float32")
    return x, y


def slow_until_requeued(seconds):
    """A callback that sleeps `seconds` after every batch until Slurm requeues.

    Slurm sets SLURM_RESTART_COUNT in a requeued job: the first allocation
    is slowed so that it reaches its time limit, the next runs at speed.
    """
    import keras

    def on_train_batch_end(batch, logs=None):
        if int(os.environ.get("SLURM_RESTART_COUNT", "0")) == 0:
            time.sleep(seconds)

    return keras.callbacks.LambdaCallback(on_train_batch_end=on_train_batch_end)


def signal_at_step(step, signum, pid=None, say=None):
    """A callback that sends `signum` to `pid` after global step `step`.

    The step is the optimizer's iteration count, so a resumed run counts
    on from the interrupted one.

    Args:
        step: The global step after which to send it.
        signum: The signal, e.g. `signal.SIGKILL`.
        pid: The process; this one when None (`os.getppid()` warns a
            launcher, as Slurm warns a batch shell).
        say: A line to print first, or None.
    """
    import keras

    class SignalAtStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            iterations = self.model.optimizer.iterations
            if int(keras.ops.convert_to_numpy(iterations)) == step:
                if say:
                    print(say, flush=True)
                os.kill(os.getpid() if pid is None else pid, signum)

    return SignalAtStep()
