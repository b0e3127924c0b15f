"""Test set-up: 4 logical CPU devices, configured once before TensorFlow starts."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import multigpu

NUM_DEVICES = 4
DEVICES = multigpu.virtual_devices(NUM_DEVICES)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(1234)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(7)
