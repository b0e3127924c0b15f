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
and how to choose that backend, and how to install TensorFlow where this
Python has none (`tensorflow_missing`: Keras on JAX runs without it).
"""

import importlib.util
import sys

import keras

from multigpu.messages import api, current_language, literal, literals

# The backends `multi_gpu_model` has an engine for, in the order the
# messages name them.
ENGINE_BACKENDS = ("tensorflow", "jax")
# What the strategies need of TensorFlow (`require_backend`): said by the
# strategies and by the calls that take a strategy as an option, on any
# backend, TensorFlow installed or not.
TF_DISTRIBUTE = ("TensorFlow's tf.distribute, whose strategies run "
                 "TensorFlow graphs")


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


# How TensorFlow is installed: its CPU and GPU builds are different
# distributions of one import, each in an extra of the package.
INSTALL_TENSORFLOW = (
    "`pip install \"multigpu[cpu]\"` (CPU only) or "
    "`pip install \"multigpu[gpu]\"` (NVIDIA GPUs, Linux); from a "
    "checkout, `pip install -e \".[cpu]\"` or `pip install -e \".[gpu]\"`")


def tensorflow_installed():
    """Whether this Python can import TensorFlow (without importing it).

    Example:
    >>> tensorflow_installed()
    True
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"] is not None
    return importlib.util.find_spec("tensorflow") is not None


def _install_tensorflow():
    """How a user installs TensorFlow, in the caller's language."""
    if current_language() == "r":
        return ("install it into the Python multigpu uses "
                "(multigpu::install_multigpu(), or "
                "reticulate::py_require(\"tensorflow\") before Python starts)")
    return f"install it with the extra for your hardware: {INSTALL_TENSORFLOW}"


def tensorflow_missing(call, written=None):
    """The error of a call that needs TensorFlow where it cannot be imported.

    Args:
        call: The public name of the call, e.g. `"mirrored_strategy"`.
        written: How the call is written instead of `api(call)`, e.g. a
            class's name (`"multigpu.MirroredModel"`).

    Returns:
        A `ModuleNotFoundError` (name `"tensorflow"`) naming the call, the
        backend that runs, how to install TensorFlow and how to choose it.

    Example:
    >>> raise tensorflow_missing("mirrored_strategy")
    Traceback (most recent call last):
    ModuleNotFoundError: multigpu.mirrored_strategy() needs TensorFlow, ...
    """
    return ModuleNotFoundError(
        f"{written or api(call)} needs TensorFlow, which this Python cannot "
        f"import (Keras runs on {literal(current())}). To use it, "
        f"{_install_tensorflow()}; then {_choose_installed('tensorflow')}.",
        name="tensorflow")


def _choose(backend):
    """How a user chooses `backend`, in the caller's language.

    For TensorFlow where it is not installed, how to install it first.
    """
    if backend == "tensorflow" and not tensorflow_installed():
        return f"{_install_tensorflow()}, then {_choose_installed(backend)}"
    return _choose_installed(backend)


def _choose_installed(backend):
    """How a user chooses an installed `backend`, in the caller's language."""
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
