"""The JAX engine's tests: they run in a pytest process of their own.

Keras chooses its backend once, at import, and JAX fixes its number of CPU
devices when it starts: the tests of the JAX engine need a process started
with `KERAS_BACKEND=jax` (`make test-python-jax`). In any other process
they are skipped, saying so.
"""

import pathlib

import keras
import pytest

HERE = pathlib.Path(__file__).resolve().parent
REASON = (
    "needs the JAX backend, which Keras chooses once per process at import: "
    "run `KERAS_BACKEND=jax pytest tests/python/engines/jax` "
    "(make test-python-jax)")


def pytest_collection_modifyitems(config, items):
    if keras.backend.backend() == "jax":
        return
    for item in items:
        if HERE in pathlib.Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=REASON))
