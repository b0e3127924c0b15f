"""The worker scripts in `tests/python/support/workers`, which the launcher, the
multi-worker and the Slurm tests start as processes of their own, and the
one-process run their training is compared with."""

import os
import sys

import keras
import numpy as np

from support.models import mlp

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
# Bounds a wedged run: far above a normal run, far below "hangs forever".
RUN_TIMEOUT = 180


def script(name):
    """The path of the worker script `name`."""
    return os.path.join(WORKERS, name)


def fresh_python(code, *options):
    """The command that runs `code` in a new Python started as the workers are.

    The code runs after `workers/_common.py`: quiet TensorFlow, and the test
    environment's optional packages hidden (`hide_optional_packages`).

    Args:
        code: Python source, as for `python -c`.
        *options: interpreter options before `-c`, such as `"-W", "always"`.

    Returns:
        The command, for `subprocess.run`.

    Example:
        >>> subprocess.run(fresh_python("import multigpu"), check=True)
    """
    prelude = f"import sys; sys.path.insert(0, {WORKERS!r}); import _common\n"
    return [sys.executable, *options, "-c", prelude + code]


def running(name):
    """Pids of live processes running the worker script `name`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if script(name).encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def common_module():
    """The workers' shared module `workers/_common.py`, imported in this process.

    Here Keras is loaded already, so importing it hides no package
    (`_common.hide_optional_packages`).

    Returns:
        The module.
    """
    sys.path.insert(0, WORKERS)
    try:
        import _common
    finally:
        sys.path.remove(WORKERS)
    return _common


def one_process_reference(initial, global_batch, epochs):
    """The workers' model trained by one process on the same global batches
    (the workers' data, `workers/_common.py`), from the weights `initial`.

    Returns:
        The model and its `History`.
    """
    _common = common_module()
    model = mlp()
    model.set_weights([np.asarray(w, "float32") for w in initial])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="mse", metrics=["mae"])
    x, y = _common.training_data()
    history = model.fit(x, y, batch_size=global_batch, epochs=epochs,
                        shuffle=False, verbose=0)
    return model, history
