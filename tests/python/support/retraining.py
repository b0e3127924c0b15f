"""One training recipe, run in the test process and in a fresh one.

`python tests/python/support/retraining.py OUT.npz` trains the recipe once per
engine in a new process and saves the template's weights: what a user who
restarts the session gets. `test_training_again.py` compares the training
that follows a failed `fit` in its own process with it.
"""

import os
import sys

import keras
import numpy as np

ENGINES = ("replicate", "mirrored")
ROWS, BATCH = 64, 16
# The recipe trains on the first 2 of the 4 logical devices, here and in the
# test process (the device count is no part of what is compared).
DEVICES = 2


def batches():
    """The recipe's data: 4 batches of 16 rows."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((ROWS, 8)).astype("float32")
    y = rng.standard_normal((ROWS, 3)).astype("float32")
    return x, y


def template():
    """A seeded template with state beside its weights (BatchNormalization)."""
    keras.utils.set_random_seed(11)
    inputs = keras.Input((8,), name="features")
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


def train(parallel):
    """Compiles `parallel` with a new Adam and trains 2 epochs; its weights."""
    x, y = batches()
    parallel.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    parallel.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return parallel.template.get_weights()


def main(out):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import multigpu

    devices = multigpu.virtual_devices(4)[:DEVICES]
    weights = {}
    for engine in ENGINES:
        parallel = multigpu.multi_gpu_model(template(), gpus=devices,
                                            engine=engine)
        for i, w in enumerate(train(parallel)):
            weights[f"{engine}_{i}"] = w
    np.savez(out, **weights)


if __name__ == "__main__":
    main(sys.argv[1])
