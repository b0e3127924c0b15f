"""The JAX engine's tests run only where Keras runs on JAX.

Keras chooses its backend once per process, at import, so these tests need
a pytest process of their own (`make test-python-jax`); in any other
process each is skipped, saying so.
"""

import keras
import pytest

NEEDS_JAX = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="needs the JAX backend, which Keras chooses once per process at "
           "import: run `KERAS_BACKEND=jax pytest tests/python/engines/jax` "
           "(make test-python-jax)")


def pytest_collection_modifyitems(config, items):
    del config  # pytest passes it by name
    for item in items:
        if "engines/jax/" in item.nodeid:
            item.add_marker(NEEDS_JAX)
