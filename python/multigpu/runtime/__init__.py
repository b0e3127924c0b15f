"""What differs between Keras's backends at run time: one module per backend.

`multigpu.runtime.tensorflow` and `multigpu.runtime.jax` answer the same
questions (which devices there are, how one device is split into several,
which devices a variable's value lives on, how to wait for a step's
results, how the processes of a job agree) each for its backend, with
functions of the same names and arguments;
`of_backend()` gives the one for the backend Keras runs on. The rest of
the package asks that module instead of branching on the backend, and the
JAX one imports no TensorFlow, so that Keras on JAX runs without it.

What both share is in `multigpu.runtime.common`, readable here too: the
cores this process may use, the warning for more simulated devices than
they can run, and TensorFlow's module once this process imported it.
"""

from multigpu import backends
from multigpu.runtime.common import (
    OVERSUBSCRIPTION,
    loaded_tensorflow,
    usable_cores,
    warn_if_oversubscribed,
)

__all__ = ["OVERSUBSCRIPTION", "loaded_tensorflow", "of_backend", "usable_cores",
           "warn_if_oversubscribed"]


def of_backend():
    """The runtime module of the Keras backend that runs.

    Returns:
        `multigpu.runtime.jax` on JAX, else `multigpu.runtime.tensorflow`
        (on PyTorch too: the devices listed there are TensorFlow's, and
        `multi_gpu_model` refuses that backend).

    Example:
    >>> of_backend().__name__
    'multigpu.runtime.tensorflow'
    """
    if backends.is_jax():
        from multigpu.runtime import jax as module
    else:  # the TensorFlow backend's runtime
        from multigpu.runtime import tensorflow as module
    return module
