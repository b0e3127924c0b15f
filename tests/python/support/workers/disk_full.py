"""Trains with checkpoint_callbacks into a directory on a disk that fills up.

Usage: disk_full.py CKPT_DIR UNITS

Prints the OSError that ends training; exits 0 unless the process crashes.
"""

import sys

import _common  # noqa: F401
import keras
import numpy as np

import multigpu


def main(directory, units):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(units),
                              keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((32, 8), "float32"), np.ones((32, 3), "float32")
    try:
        model.fit(x, y, batch_size=8, epochs=20, verbose=0, shuffle=False,
                  callbacks=multigpu.checkpoint_callbacks(
                      directory, max_to_keep=None))
    except OSError as error:
        print(f"OSError: {error}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
