"""Shared set-up of the worker scripts: quiet TensorFlow, the test models."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
