"""Benchmark of multi_gpu_model's engines: replicate vs mirrored.

    .venv/bin/python bench/engines.py [--rounds 3] [--rows 8192]

For 1, 2 and 4 logical devices (one fresh process each, as
`multigpu.virtual_devices(n)` must run before TensorFlow starts), trains the
same MLP (784-256-256-10, global batch 256) with plain Keras, with
`multi_gpu_model(engine="replicate")` and with `engine="mirrored"`. The
engines run interleaved, round after round, so that load from other
processes hits them alike; each throughput is the median over rounds of the
second epoch of a 2-epoch `fit` (steady-state steps, timed by a callback),
after a warm-up `fit` that traces the step. Prints a table of
samples/s and of the ratios to plain Keras on the same devices.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ENGINES = ("plain", "replicate", "mirrored")
DEVICE_COUNTS = (1, 2, 4)


def _model():
    import keras

    inputs = keras.Input((784,))
    hidden = keras.layers.Dense(256, activation="relu")(inputs)
    hidden = keras.layers.Dense(256, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(10)(hidden))


def _trainer(engine, devices):
    import keras

    import multigpu

    keras.utils.set_random_seed(0)
    template = _model()
    model = template if engine == "plain" else multigpu.multi_gpu_model(
        template, gpus=None, engine=engine)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    return model


def child(devices, rounds, rows, batch):
    """Measures every engine on `devices` logical devices; prints JSON."""
    import warnings

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import multigpu

    multigpu.virtual_devices(devices)
    import numpy as np

    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 784)).astype("float32")
    y = rng.integers(0, 10, rows)
    models = {engine: _trainer(engine, devices) for engine in ENGINES}
    for model in models.values():  # warm-up: trace and build
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    rates = {engine: [] for engine in ENGINES}
    for _ in range(rounds):
        for engine, model in models.items():
            timer = _EpochTimer()
            model.fit(x, y, batch_size=batch, epochs=2, verbose=0,
                      callbacks=[timer])
            rates[engine].append(rows / timer.seconds[-1])
    print(json.dumps({"devices": devices, "rates": rates}))


def _epoch_timer():
    import keras

    class EpochTimer(keras.callbacks.Callback):
        """Times epochs inside fit: steady-state steps, not fit's set-up."""

        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._start)

    return EpochTimer()


_EpochTimer = _epoch_timer


def _run_child(devices, options):
    command = [sys.executable, os.path.abspath(__file__), "--child",
               str(devices), "--rounds", str(options.rounds), "--rows",
               str(options.rows), "--batch", str(options.batch)]
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{devices} device(s) failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _table(results, options):
    lines = [
        f"multi_gpu_model engines: MLP 784-256-256-10, {options.rows} rows, "
        f"global batch {options.batch}, median of {options.rounds} rounds; "
        f"{os.cpu_count()} CPU core(s), logical CPU devices",
        "",
        "| devices | plain Keras (samples/s) | replicate | mirrored "
        "| replicate / plain | mirrored / plain | mirrored / replicate |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        median = {e: statistics.median(r) for e, r in result["rates"].items()}
        lines.append(
            f"| {result['devices']} | {median['plain']:.0f} "
            f"| {median['replicate']:.0f} | {median['mirrored']:.0f} "
            f"| {median['replicate'] / median['plain']:.2f} "
            f"| {median['mirrored'] / median['plain']:.2f} "
            f"| {median['mirrored'] / median['replicate']:.2f} |"
        )
    lines.append("")
    lines.append("per-round samples/s: " + json.dumps(
        {r["devices"]: {e: [round(v) for v in rates]
                        for e, rates in r["rates"].items()}
         for r in results}))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(options.child, options.rounds, options.rows, options.batch)
        return
    results = [_run_child(n, options) for n in DEVICE_COUNTS]
    print(_table(results, options))


if __name__ == "__main__":
    main()
