"""What the runtime modules of every backend share, and import from here.

The cores this process may use, the warning for more simulated devices than
they can run, TensorFlow's module when this process imported it, and how a
step is timed.
"""

import os
import sys
import time
import warnings

from multigpu.messages import api, literal

# Logical CPU devices per core above which `virtual_devices` warns.
OVERSUBSCRIPTION = 8


def loaded_tensorflow():
    """TensorFlow's module if this process imported it, else None.

    A `tf.data.Dataset`, a `tf.Tensor` or a strategy exists only once
    TensorFlow is imported: the checks that tell them apart from other
    values ask here, and import nothing.

    Example:
    >>> tf = loaded_tensorflow()
    >>> tf is not None and isinstance(x, tf.data.Dataset)
    False
    """
    return sys.modules.get("tensorflow")


def usable_cores():
    """The cores this process may run on (its affinity where the OS has it).

    Returns:
        An int >= 1: `os.sched_getaffinity` on Linux, `os.cpu_count()`
        elsewhere (macOS and Windows have no affinity call).

    Example:
    >>> usable_cores()
    2
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def warn_if_oversubscribed(n, device_type):
    """Warns when `n` logical CPU devices are far more than the cores.

    More than `OVERSUBSCRIPTION` per core only slow a simulation: the
    devices share the cores. Called by each runtime's `virtual_devices`
    (its `stacklevel` points at the caller of `multigpu.virtual_devices`).

    Args:
        n: The number of logical devices asked for.
        device_type: `"CPU"` or `"GPU"` (GPUs are never warned about).

    Example:
    >>> warn_if_oversubscribed(64, "CPU")   # on 2 cores: a UserWarning
    """
    cores = usable_cores()
    if device_type != "CPU" or n <= OVERSUBSCRIPTION * cores:
        return
    warnings.warn(
        f"{api('virtual_devices', literal(n))} creates {n} logical CPU "
        f"devices on {cores} core(s), more than {OVERSUBSCRIPTION} per core: "
        "they share the cores, so each replica runs slowly and every device "
        "costs memory and threads. Simulate a realistic device count (e.g. "
        f"{api('virtual_devices', literal(min(4, max(2, cores))))}).",
        UserWarning, stacklevel=4,
    )


def time_calls(step, steps):
    """The seconds of each of `steps` calls of `step`, after one untimed call.

    The untimed call traces and compiles; `step` must return only once its
    results are computed (the runtimes wait for them inside it).

    Args:
        step: A function of no arguments that runs one training step.
        steps: How many calls to time.

    Returns:
        A list of `steps` floats.

    Example:
    >>> time_calls(lambda: wait(model.train_function(iterator)), 5)
    [0.0031, 0.0029, 0.0030, 0.0030, 0.0029]
    """
    step()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return seconds
