"""What `sync_batchnorm=True` costs per training step, next to the default.

    python -m bench.sync_batchnorm_cost --output docs/bench/sync-batchnorm-cost

For each BatchNormalization workload below, engine and device count, one
process (its logical CPU devices fixed at start) builds the same template
twice with the same weights, one parallel model with per-replica statistics
(`sync_batchnorm=False`, the default) and one with statistics pooled over
the whole batch (`sync_batchnorm=True`), and takes one training step of
each in turn on a repeated batch, the order shuffled every round
(`bench.guard_cost.paired`). Per round the ratio of the pooled step to the
per-replica one; the median ratio and its 95% bootstrap interval are
reported. Both models see the same load, so the ratio survives a busy
machine better than two separate runs would.

What is pooled: the replicate engine runs the template node by node across
the replicas and adds each BatchNormalization layer's sums on the merge
device; the mirrored engine adds them with one all-reduce per layer and a
second for the squares.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench import report
from bench.guard_cost import paired

DEVICE_COUNTS = (2, 4)
ENGINES = ("replicate", "mirrored")
NUM_CLASSES = 10

# name: (description, batch size, input shape)
WORKLOADS = {
    "bn_mlp": ("MLP 784-256-256-10, BatchNormalization after each hidden "
               "layer, batch 256", 256, (784,)),
    "bn_cnn": ("CNN of 3 conv + BatchNormalization blocks (16-32-32 "
               "filters) on 32x32x3, batch 128", 128, (32, 32, 3)),
}


def build_model(name):
    """A fresh BatchNormalization model of a workload (softmax, 10 classes)."""
    import keras

    layers = keras.layers
    shape = WORKLOADS[name][2]
    inputs = keras.Input(shape)
    x = inputs
    if name == "bn_mlp":
        for units in (256, 256):
            x = layers.Dense(units)(x)
            x = layers.Activation("relu")(layers.BatchNormalization()(x))
    else:
        for filters in (16, 32, 32):
            x = layers.Conv2D(filters, 3, padding="same")(x)
            x = layers.Activation("relu")(layers.BatchNormalization()(x))
            x = layers.MaxPooling2D()(x)
        x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(NUM_CLASSES, activation="softmax")(x)
    return keras.Model(inputs, outputs, name=name)


def _model(workload, devices, engine, sync_batchnorm, weights):
    import keras

    import multigpu

    template = build_model(workload)
    template.set_weights(weights)
    model = multigpu.multi_gpu_model(template, gpus=devices, engine=engine,
                                     sync_batchnorm=sync_batchnorm)
    model.compile(optimizer=keras.optimizers.SGD(1e-3),
                  loss="sparse_categorical_crossentropy")
    return model


def measure(workload, devices, engine, rounds):
    """One workload, engine and device set: pooled against per-replica.

    Returns:
        A dict of the results (milliseconds and the ratio with its
        interval).
    """
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    _, batch, shape = WORKLOADS[workload]
    rng = np.random.default_rng(0)
    x = rng.random((batch, *shape), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, batch, dtype=np.int32)
    weights = build_model(workload).get_weights()
    seconds = paired(
        {"pooled": _model(workload, devices, engine, True, weights),
         "per_replica": _model(workload, devices, engine, False, weights)},
        x, y, rounds)
    ratios = [a / b for a, b in zip(seconds["pooled"],
                                    seconds["per_replica"])]
    low, high = report.median_interval(ratios)
    return {
        "workload": workload, "devices": len(devices), "engine": engine,
        "rounds": rounds, "batch_size": batch,
        "per_replica_ms": 1e3 * statistics.median(seconds["per_replica"]),
        "pooled_ms": 1e3 * statistics.median(seconds["pooled"]),
        "ratio": statistics.median(ratios), "ratio_low": low,
        "ratio_high": high,
    }


def worker(n, workloads, engines, rounds):
    import warnings

    import multigpu

    devices = multigpu.virtual_devices(n)
    warnings.simplefilter("ignore", UserWarning)
    rows = []
    for workload in workloads:
        for engine in engines:
            rows.append(measure(workload, devices, engine, rounds))
            # Progress on stderr; the rows go to stdout at the end.
            print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr,
                  flush=True)
    return rows


def markdown(rows):
    """The results as a Markdown table."""
    lines = [
        "| workload | engine | devices | per-replica step (ms) "
        "| pooled step (ms) | pooled / per-replica: median [95% interval] |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['engine']} | {r['devices']} | "
            f"{r['per_replica_ms']:.2f} | {r['pooled_ms']:.2f} | "
            f"{r['ratio']:.3f} [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}] |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.sync_batchnorm_cost")
    parser.add_argument("--output", default="out/sync-batchnorm-cost")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--devices", default=",".join(map(str, DEVICE_COUNTS)))
    parser.add_argument("--rounds", type=int, default=60,
                        help="paired steps per configuration")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown --workloads {sorted(unknown)}; expected some "
                     f"of {list(WORKLOADS)}")
    engines = [e for e in args.engines.split(",") if e]
    if args.worker:
        print(json.dumps(worker(args.worker, workloads, engines, args.rounds)))
        return 0
    rows = []
    load_before = os.getloadavg()[0]
    for n in [int(d) for d in args.devices.split(",")]:
        done = subprocess.run(
            [sys.executable, "-m", "bench.sync_batchnorm_cost", "--worker",
             str(n), "--workloads", ",".join(workloads), "--engines",
             ",".join(engines), "--rounds", str(args.rounds)],
            stdout=subprocess.PIPE, text=True, check=False,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if done.returncode:
            raise SystemExit(
                f"sync_batchnorm_cost worker on {n} devices failed")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    report.write_results(
        args.output, {"rows": rows, "load_1min_before": load_before,
                      "load_1min_after": os.getloadavg()[0]},
        markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
