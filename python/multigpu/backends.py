"""Which Keras backend runs, and which of them this package's engines serve.

Keras 3 chooses its backend once, at import (`KERAS_BACKEND`, or
`keras3::use_backend()` in R). `multi_gpu_model` has engines for
TensorFlow and for JAX; on any other backend (PyTorch) it refuses in one
error (`check_supported`), and an engine for it would be added beside
`multigpu.engines.tensorflow` and `multigpu.engines.jax`, and named in
`ENGINE_BACKENDS`.

The calls that run on TensorFlow only (its graphs, `tf.distribute`) refuse
every other backend through one maker, `require_backend`, so that each
says the same things: the call, the backend that runs, what the call needs
and how to choose that backend.
"""

import keras

from multigpu.messages import api, current_language, literal, literals

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


def _choose(backend):
    """How a user chooses `backend`, in the caller's language."""
    if current_language() == "r":
        return (f"call keras3::use_backend(\"{backend}\") before Keras is "
                "first used in the R session")
    return (f"set the environment variable KERAS_BACKEND={backend} before "
            "Keras is imported (in R, keras3::use_backend("
            f"\"{backend}\"))")


def require_backend(call, needs, backend="tensorflow", written=None,
                    otherwise=None):
    """Refuses `call` unless Keras runs on `backend`.

    The one maker of the package's "needs another backend" errors: each
    names the call, the backend that runs, what the call needs there, and
    how to choose `backend`, in the caller's language
    (`multigpu.messages`).

    Args:
        call: The public name of the call, e.g. `"mirrored_strategy"`,
            written as the user calls it (`messages.api`).
        needs: What the call needs of `backend`, completing "it needs",
            e.g. `"TensorFlow's tf.distribute"`.
        backend: The backend the call runs on, or a tuple of the backends
            it runs on (the first is the one the error suggests).
        written: How the call is written instead of `api(call)`, for a
            setting (`messages.setting("check_finite", True)`) or a call
            with an argument.
        otherwise: A way to go on without the call on the backend that
            runs, e.g. `"leave check_finite=False"`, or None.

    Returns:
        The name of the backend that runs.

    Raises:
        UnsupportedBackendError: when another backend runs.

    Example:
    >>> require_backend("mirrored_strategy", "TensorFlow's tf.distribute")
    'tensorflow'
    """
    running = current()
    allowed = (backend,) if isinstance(backend, str) else tuple(backend)
    if running in allowed:
        return running
    names = " or ".join(literal(name) for name in allowed)
    raise UnsupportedBackendError(
        f"{written or api(call)} runs on the Keras backend "
        f"{names} only, and Keras runs on {literal(running)}: it "
        f"needs {needs}. To use it, {_choose(allowed[0])}"
        + (f"; otherwise {otherwise}." if otherwise else ".")
    )
