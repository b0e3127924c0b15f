"""RSS growth per build-and-fit cycle of multi_gpu_model (a hyper-parameter
search or a notebook builds many models in one process).

    python bench/rebuild_memory.py [CYCLES]

Prints the RSS after each cycle and the growth per cycle after 5 warm-up
cycles. Target: < 3 MiB per cycle (before custom gradients were moved out of
TensorFlow's registry: 12.3 MiB per cycle on this 2-device MLP).
"""

import gc
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import multigpu

multigpu.virtual_devices(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

WARM_UP = 5


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cycle(x, y):
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    parallel = multigpu.multi_gpu_model(model, gpus=2)
    parallel.compile(optimizer="adam", loss="mse")
    parallel.fit(x, y, batch_size=16, epochs=1, verbose=0)


def main(cycles):
    rng = np.random.default_rng(0)
    x = rng.random((64, 8), dtype="float32")
    y = rng.random((64, 3), dtype="float32")
    marks = []
    for _ in range(cycles):
        cycle(x, y)
        keras.backend.clear_session()
        gc.collect()
        marks.append(rss_mib())
    print("rss MiB after each cycle:", [round(m) for m in marks])
    per_cycle = (marks[-1] - marks[WARM_UP - 1]) / (cycles - WARM_UP)
    print(f"growth per cycle after {WARM_UP} warm-up cycles: "
          f"{per_cycle:.2f} MiB")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
