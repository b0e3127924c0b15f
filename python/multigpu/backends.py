"""Which Keras backend runs, and which of them this package's engines serve.

Keras 3 chooses its backend once, at import (`KERAS_BACKEND`, or
`keras3::use_backend()` in R). `multi_gpu_model` has engines for
TensorFlow and for JAX; on any other backend (PyTorch) it refuses in one
error (`check_supported`), and an engine for it would be added beside
`multigpu.engines.tensorflow` and `multigpu.engines.jax`, and named in
`ENGINE_BACKENDS`.
"""

import keras

from multigpu.messages import api, literals

# The backends `multi_gpu_model` has an engine for, in the order the
# messages name them.
ENGINE_BACKENDS = ("tensorflow", "jax")


class UnsupportedBackendError(RuntimeError):
    """A call this package cannot make on the Keras backend that runs."""


def current():
    """The name of the Keras backend that runs: `"tensorflow"`, `"jax"`, ...

    Example:
    >>> current()
    'tensorflow'
    """
    return keras.backend.backend()


def is_jax():
    """Whether Keras runs on JAX."""
    return current() == "jax"


def check_supported(call):
    """Refuses `call` on a backend no engine of this package serves.

    Args:
        call: The public name of the call, e.g. `"multi_gpu_model"`.

    Returns:
        The backend's name, one of `ENGINE_BACKENDS`.

    Raises:
        UnsupportedBackendError: on another backend (PyTorch), naming the
            backends that work and how to choose one.

    Example:
    >>> check_supported("multi_gpu_model")
    'tensorflow'
    """
    backend = current()
    if backend in ENGINE_BACKENDS:
        return backend
    raise UnsupportedBackendError(
        f"{api(call)} has no engine for the Keras backend {backend!r}: it runs "
        f"on the backends {literals(list(ENGINE_BACKENDS), 'and')}. Choose one before Keras is imported: the "
        "environment variable KERAS_BACKEND=jax (or tensorflow), or "
        "keras3::use_backend(\"jax\") in R."
    )
