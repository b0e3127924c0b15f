"""The mirrored engine against Keras's own `fit` under MirroredStrategy by hand.

    python -m bench.mirrored_vs_hand --rounds 24 --steps 32 --output docs/bench/mirrored-vs-hand

The target: `multi_gpu_model(model, gpus=n, engine="mirrored")` trains at
least as fast as the script a user writes from the Keras guide, a
`tf.distribute.MirroredStrategy` over the same devices with the model built
and compiled in `strategy.scope()`, trained by Keras's `fit`. One worker
process (logical devices are fixed when TensorFlow starts; two
MirroredStrategy objects live side by side in it because multigpu's
strategies use their own range of collective keys) builds, from the same
seed, a small CNN three times:

* `hand`: the CNN built and compiled in `MirroredStrategy(devices).scope()`;
* `ours`: `multi_gpu_model(cnn, gpus=n, engine="mirrored")`, the NaN/inf
  guard on (the default);
* `ours_unguarded`: the same with `check_finite = False`.

Each trains with the same optimizer (Adam) and loss on the same synthetic
rows, `--rows-per-replica` rows per replica per step, `--steps` steps per
epoch. Every configuration first fits `--warmup` untimed epochs (the first
traces the step); then `--rounds` rounds fit one epoch of each in turn
(hand, ours, ours_unguarded), the order rotated by one every round so that
no configuration always runs first. Per configuration the median epoch
time, the median step inside `fit` (a callback's batch begin to end) and
the time from the call of `fit` to its first step (its setup of the data
and of the distributed iterator, paid by every call); per round the throughput ratio `hand epoch / ours epoch`
(above 1: ours is faster), its median, 95% bootstrap interval
(`report.median_interval`) and min-max over the rounds; the same for the
guard (`guarded epoch / unguarded epoch`, above 1: the guard costs); and
the same ratios of the median steps.

Writes `results.json` (everything, with the machine's load and `uptime`
before and after), `results.md` and `rounds.csv` (seconds per round and
configuration).
"""

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from bench import report

CONFIGS = ("hand", "ours", "ours_unguarded")
IMAGE = (16, 16, 3)
CLASSES = 10


def _uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def _cnn():
    import keras

    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input(IMAGE),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES)])


def _compile(model):
    import keras

    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def build(devices):
    """The three configurations on `devices`, compiled: `{name: model}`."""
    import tensorflow as tf

    import multigpu

    hand = tf.distribute.MirroredStrategy(devices)
    with hand.scope():
        hand_model = _cnn()
        _compile(hand_model)
    models = {"hand": hand_model}
    for name, guard in (("ours", True), ("ours_unguarded", False)):
        parallel = multigpu.multi_gpu_model(_cnn(), gpus=len(devices),
                                            engine="mirrored")
        parallel.check_finite = guard
        _compile(parallel)
        models[name] = parallel
    return models


def data(batch_size, steps, seed=0):
    """`steps` batches of synthetic images and labels, as numpy arrays."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size * steps, *IMAGE)).astype("float32")
    y = rng.integers(0, CLASSES, batch_size * steps).astype("int32")
    return x, y


def _step_timer(clock):
    """A Keras callback: when each batch of an epoch began and ended.

    From `on_train_batch_begin` to `on_train_batch_end`: the step's call
    (which returns its logs once the step is done), not the data's setup,
    which `fit` pays before the first step.
    """
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.begins, self.ends = [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.begins.append(clock())

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(clock())

    return StepTimer()


def rounds(models, x, y, batch_size, count, warmup, clock=time.perf_counter):
    """Epochs of `fit` of each model in turn, the order rotated every round.

    Args:
        models: `{name: compiled model}`.
        x, y: The epoch's rows.
        batch_size: Rows per step (all replicas).
        count: Timed rounds.
        warmup: Untimed epochs of each model first.
        clock: The clock, in seconds.

    Returns:
        `({name: [epoch per round]}, [order of each round])`, each epoch a
        dict of seconds: `epoch` (the call of `fit`), `steps` (each step),
        `before` (from the call to the first step) and `after` (from the
        last step to the return).
    """
    timer = _step_timer(clock)

    def epoch(model):
        timer.begins, timer.ends = [], []
        start = clock()
        model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0,
                  shuffle=False, callbacks=[timer])
        end = clock()
        return {"epoch": end - start,
                "steps": [e - b for b, e in zip(timer.begins, timer.ends,
                                                strict=True)],
                "before": timer.begins[0] - start,
                "after": end - timer.ends[-1]}

    for model in models.values():
        for _ in range(warmup):
            epoch(model)
    names = list(models)
    seconds, orders = {name: [] for name in names}, []
    for index in range(count):
        shift = index % len(names)
        order = names[shift:] + names[:shift]
        orders.append(order)
        for name in order:
            seconds[name].append(epoch(models[name]))
        print(f"round {index + 1}/{count}: " + ", ".join(
            f"{name} {seconds[name][-1]['epoch']:.3f} s" for name in names),
            file=sys.stderr, flush=True)
    return seconds, orders


def summary(name, numerator, denominator):
    """Per-round `numerator / denominator`: median, 95% interval, min-max."""
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    low, high = report.median_interval(ratios)
    return {name: statistics.median(ratios), f"{name}_low": low,
            f"{name}_high": high, f"{name}_min": min(ratios),
            f"{name}_max": max(ratios)}


def worker(count, args):
    """The whole measurement in this process on `count` logical devices."""
    import warnings

    import multigpu

    devices = multigpu.virtual_devices(count)
    warnings.simplefilter("ignore", UserWarning)
    import keras
    import tensorflow as tf

    batch_size = args.rows_per_replica * count
    x, y = data(batch_size, args.steps)
    models = build(devices)
    epochs, orders = rounds(models, x, y, batch_size, args.rounds,
                            args.warmup)
    # Per round: the epoch, the median step inside fit, and the time before
    # the first step (fit's setup of the data and of its iterator).
    seconds = {name: [e["epoch"] for e in epochs[name]] for name in CONFIGS}
    step = {name: [statistics.median(e["steps"]) for e in epochs[name]]
            for name in CONFIGS}
    before = {name: [e["before"] for e in epochs[name]] for name in CONFIGS}
    return {
        "devices": count, "rows_per_replica": args.rows_per_replica,
        "batch_size": batch_size, "steps_per_epoch": args.steps,
        "rounds": args.rounds, "warmup_epochs": args.warmup,
        **{f"{name}_epoch_s": statistics.median(seconds[name])
           for name in CONFIGS},
        **{f"{name}_step_ms": 1e3 * statistics.median(step[name])
           for name in CONFIGS},
        **{f"{name}_before_s": statistics.median(before[name])
           for name in CONFIGS},
        # Throughput ratios: above 1, ours trains faster than the hand script.
        **summary("ours_vs_hand", seconds["hand"], seconds["ours"]),
        **summary("unguarded_vs_hand", seconds["hand"],
                  seconds["ours_unguarded"]),
        # Time ratio: above 1, the guard costs.
        **summary("guard", seconds["ours"], seconds["ours_unguarded"]),
        # The same, of the median step inside fit.
        **summary("step_ours_vs_hand", step["hand"], step["ours"]),
        **summary("step_unguarded_vs_hand", step["hand"],
                  step["ours_unguarded"]),
        **summary("step_guard", step["ours"], step["ours_unguarded"]),
        "epochs": epochs, "orders": orders,
        "tensorflow": tf.__version__, "keras": keras.__version__,
    }


def _interval(row, name):
    return (f"{row[name]:.3f}x [{row[name + '_low']:.3f}, "
            f"{row[name + '_high']:.3f}] (min-max {row[name + '_min']:.3f}"
            f"-{row[name + '_max']:.3f})")


def markdown(result):
    """`results.md`: the epochs, the ratios, the load."""
    row = result["row"]
    lines = [
        f"# Mirrored engine vs MirroredStrategy by hand, {row['devices']} "
        "logical CPU devices",
        "",
        f"Small CNN, {row['rows_per_replica']} rows per replica (batch "
        f"{row['batch_size']}), {row['steps_per_epoch']} steps per epoch, "
        f"{row['rounds']} rounds after {row['warmup_epochs']} warm-up "
        f"epoch(s) each; TensorFlow {row['tensorflow']}, Keras "
        f"{row['keras']}, {result['cpu_count']} CPUs.",
        "",
        "| configuration | median epoch (s) | median step in fit (ms) "
        "| fit's call to its first step (s) |",
        "|---|---:|---:|---:|",
    ]
    labels = {"hand": "MirroredStrategy by hand, Keras fit",
              "ours": "multi_gpu_model, engine=\"mirrored\" (guard on)",
              "ours_unguarded": "multi_gpu_model, engine=\"mirrored\", "
                                "check_finite=False"}
    for name in CONFIGS:
        lines.append(f"| {labels[name]} | {row[name + '_epoch_s']:.3f} | "
                     f"{row[name + '_step_ms']:.1f} | "
                     f"{row[name + '_before_s']:.3f} |")
    lines += [
        "",
        "| ratio (per round) | median [95% interval] (min-max) |",
        "|---|---|",
        "| throughput ours / hand (guard on) | "
        f"{_interval(row, 'ours_vs_hand')} |",
        "| throughput ours / hand (guard off) | "
        f"{_interval(row, 'unguarded_vs_hand')} |",
        f"| epoch guard on / guard off | {_interval(row, 'guard')} |",
        "| step throughput ours / hand (guard on) | "
        f"{_interval(row, 'step_ours_vs_hand')} |",
        "| step throughput ours / hand (guard off) | "
        f"{_interval(row, 'step_unguarded_vs_hand')} |",
        f"| step guard on / guard off | {_interval(row, 'step_guard')} |",
        "",
        f"Load before: `{result['uptime_before']}`",
        "",
        f"Load after: `{result['uptime_after']}`",
        "",
    ]
    return "\n".join(lines)


def write_rounds(directory, row):
    """`rounds.csv`: one line per round and configuration, in seconds."""
    with open(os.path.join(directory, "rounds.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["round", "position", "config", "epoch_s",
                         "median_step_s", "before_first_step_s",
                         "after_last_step_s", "steps"])
        for index, order in enumerate(row["orders"]):
            for position, name in enumerate(order):
                epoch = row["epochs"][name][index]
                writer.writerow([
                    index + 1, position + 1, name, f"{epoch['epoch']:.6f}",
                    f"{statistics.median(epoch['steps']):.6f}",
                    f"{epoch['before']:.6f}", f"{epoch['after']:.6f}",
                    len(epoch["steps"])])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.mirrored_vs_hand")
    parser.add_argument("--output", default="out/mirrored-vs-hand")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds of 2-step epochs: a smoke run")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--steps", type=int, default=32,
                        help="steps per epoch")
    parser.add_argument("--rows-per-replica", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed epochs of each configuration first")
    parser.add_argument("--worker", action="store_true",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = 3, 2, 1
    if args.worker:
        print(json.dumps(worker(args.devices, args)))
        return 0
    uptime_before = _uptime()
    worker_argv = [sys.executable, "-m", "bench.mirrored_vs_hand",
                   "--worker", "--devices", str(args.devices),
                   "--rounds", str(args.rounds), "--steps", str(args.steps),
                   "--rows-per-replica", str(args.rows_per_replica),
                   "--warmup", str(args.warmup)]
    done = subprocess.run(worker_argv, stdout=subprocess.PIPE, text=True,
                          check=False,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if done.returncode:
        raise SystemExit("mirrored_vs_hand worker failed")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    result = {"row": row, "uptime_before": uptime_before,
              "uptime_after": _uptime(), "cpu_count": os.cpu_count(),
              "machine": platform.machine(), "python": platform.python_version()}
    text = markdown(result)
    report.write_results(args.output, result, text)
    write_rounds(args.output, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
