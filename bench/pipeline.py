"""Measures micro-batch pipelining of `model_parallel` (prints numbers).

Times training steps of one MLP cut into 4 stages on 4 simulated devices,
with microbatches = 1, 2, 4, 8, against the un-partitioned model. Simulated
devices share the machine's cores, so this shows the overhead of
partitioning and pipelining here; the overlap pays off only where stages run
on separate hardware (GPUs).

Run: .venv/bin/python bench/pipeline.py [--width 1024] [--batch 512]
"""

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import multigpu

DEVICES = multigpu.virtual_devices(4)
warnings.filterwarnings("ignore", message="No GPU found")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")


def build(width, depth, input_dim):
    layers = [keras.Input((input_dim,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    layers.append(keras.layers.Dense(1))
    return keras.Sequential(layers)


def compiled(model, x, y):
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    model.train_on_batch(x, y)  # trace and warm up
    model.train_on_batch(x, y)
    return model


def interleaved_step_times(models, x, y, rounds):
    """Times one step of each model per round, so load drift hits all alike."""
    times = {label: [] for label in models}
    for _ in range(rounds):
        for label, model in models.items():
            start = time.perf_counter()
            model.train_on_batch(x, y)
            times[label].append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.width)).astype("float32")
    y = rng.standard_normal((args.batch, 1)).astype("float32")
    template = build(args.width, args.depth, args.width)
    print(f"MLP {args.depth}x{args.width}, batch {args.batch}, "
          f"{len(DEVICES)} simulated devices on {os.cpu_count()} core(s); "
          f"median of {args.steps} training steps, interleaved")
    print(f"{'configuration':<28}{'median ms':>10}{'min ms':>9}{'vs k=1':>9}")
    models = {"template (no partition)": compiled(
        keras.models.clone_model(template), x, y)}
    for k in (1, 2, 4, 8):
        models[f"model_parallel k={k}"] = compiled(multigpu.model_parallel(
            template, devices=4, microbatches=k), x, y)
    times = interleaved_step_times(models, x, y, args.steps)
    baseline = statistics.median(times["model_parallel k=1"]) * 1e3
    for label, values in times.items():
        median = statistics.median(values) * 1e3
        print(f"{label:<28}{median:>10.1f}{min(values) * 1e3:>9.1f}"
              f"{median / baseline:>8.2f}x")


if __name__ == "__main__":
    main()
