"""What `multigpu.ScalingMonitor` costs per step, and its one-off baseline.

    python -m bench.monitor_cost --output docs/bench/monitor-cost

The monitor wraps the model's `train_function` for the length of a `fit`:
per step, two clock reads and three list appends around the call. For
each workload of `bench/models.py`, engine and device count, one process
(its logical CPU devices fixed at start) compiles one model and times,
side by side:

* **paired steps**: one step through the monitor's wrapper and one through
  the bare `train_function`, in turn (order shuffled every round), on a
  repeated batch of the workload's size, `--rounds` rounds after a warm-up:
  per round the ratio of the monitored step to the bare one, its median and
  95% bootstrap interval (`report.median_interval`). Both are steps of the
  same model, so both see the same load;
* **the wrapper alone**: the wrapper around a function that does nothing,
  net of calling that function directly: what the monitor adds to a step,
  free of the step's noise, in microseconds and in percent of a bare step;
* **the baseline**: the seconds the first monitored step spent training the
  one-device copy (`ScalingMonitor.baseline_cost_seconds`, with the default
  5 timed steps), once per `fit`, and how many bare steps that is.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

from bench import models, report

DEVICE_COUNTS = (2, 4)
ENGINES = ("replicate", "mirrored", "strategy")


def _model(workload, devices, engine):
    import keras

    import multigpu

    if engine == "strategy":
        strategy = multigpu.mirrored_strategy(devices)
        with strategy.scope():
            model = models.build_model(workload)
            model.compile(optimizer=keras.optimizers.SGD(1e-3),
                          loss="sparse_categorical_crossentropy")
        return model
    model = multigpu.multi_gpu_model(models.build_model(workload),
                                     gpus=devices, engine=engine)
    model.compile(optimizer=keras.optimizers.SGD(1e-3),
                  loss="sparse_categorical_crossentropy")
    return model


def _iterator(model, x, y):
    """A repeated batch, distributed as `fit` distributes it."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    strategy = model.distribute_strategy
    if strategy.num_replicas_in_sync > 1:
        return iter(strategy.experimental_distribute_dataset(dataset))
    return iter(dataset)


def _runner(function, iterator):
    import tensorflow as tf

    def step():
        logs = function(iterator)
        for value in tf.nest.flatten(logs):
            value.numpy()

    return step


def _timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _wrapper_alone(rounds, seed=0):
    """Seconds the monitor's wrapper adds to a call, per call, net of it."""
    import multigpu

    monitor = multigpu.ScalingMonitor(baseline_steps=0)

    def nothing(iterator):
        return iterator

    wrapped = monitor._timed(nothing)
    wrapped([])   # the first call keeps the batch; the wrapper's path after it
    calls = 1000
    seconds = {"wrapped": [], "bare": []}
    order = random.Random(seed)
    for _ in range(rounds):
        names = list(seconds)
        order.shuffle(names)
        for name in names:
            function = wrapped if name == "wrapped" else nothing
            start = time.perf_counter()
            for _ in range(calls):
                function(None)
            seconds[name].append((time.perf_counter() - start) / calls)
    return [a - b for a, b in zip(seconds["wrapped"], seconds["bare"])]


def measure(workload, devices, engine, rounds):
    """One workload, engine and device set: the monitor's cost per step.

    Returns:
        A dict of the results (milliseconds, ratios, percent, seconds).
    """
    import keras

    import multigpu

    keras.utils.set_random_seed(0)
    x_all, y_all = models.load_data(workload)
    batch = models.WORKLOADS[workload].batch_size
    x, y = x_all[:batch], y_all[:batch]
    model = _model(workload, devices, engine)
    model.make_train_function()
    bare_function = model.train_function
    monitor = multigpu.ScalingMonitor(warn=False)
    monitor.set_model(model)
    monitor.on_train_begin()
    monitored_function = model.train_function
    steps = {
        "monitored": _runner(monitored_function, _iterator(model, x, y)),
        "bare": _runner(bare_function, _iterator(model, x, y)),
    }
    for _ in range(5):   # the first monitored step measures the baseline
        for step in steps.values():
            step()
    baseline_seconds = monitor.baseline_cost_seconds
    names = list(steps)
    seconds = {name: [] for name in names}
    order = random.Random(0)
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            seconds[name].append(_timed(steps[name]))
    monitor.on_train_end()
    ratios = [a / b for a, b in zip(seconds["monitored"], seconds["bare"])]
    low, high = report.median_interval(ratios)
    bare_ms = 1e3 * statistics.median(seconds["bare"])
    alone_us = 1e6 * statistics.median(_wrapper_alone(max(rounds // 10, 10)))
    return {
        "workload": workload, "devices": len(devices), "engine": engine,
        "rounds": rounds, "batch_size": batch,
        "monitored_ms": 1e3 * statistics.median(seconds["monitored"]),
        "bare_ms": bare_ms, "ratio": statistics.median(ratios),
        "ratio_low": low, "ratio_high": high,
        "wrapper_alone_us": alone_us,
        "wrapper_alone_percent": 100 * alone_us / 1e3 / bare_ms,
        "baseline_seconds": baseline_seconds,
        "baseline_steps_equivalent": 1e3 * baseline_seconds / bare_ms,
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
            print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr,
                  flush=True)
    return rows


def markdown(rows):
    """The results as a Markdown table."""
    lines = [
        "| workload | engine | devices | bare step (ms) | monitored step (ms) "
        "| monitored / bare: median [95% interval] | wrapper alone (µs) "
        "| wrapper alone, % of a step | baseline, once per fit (s) "
        "| baseline, in bare steps |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['engine']} | {r['devices']} | "
            f"{r['bare_ms']:.2f} | {r['monitored_ms']:.2f} | {r['ratio']:.3f} "
            f"[{r['ratio_low']:.3f}, {r['ratio_high']:.3f}] | "
            f"{r['wrapper_alone_us']:.2f} | {r['wrapper_alone_percent']:.3f}% | "
            f"{r['baseline_seconds']:.2f} | {r['baseline_steps_equivalent']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.monitor_cost")
    parser.add_argument("--output", default="out/monitor-cost")
    parser.add_argument("--workloads", default="demo,mnist_cnn")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--devices", default=",".join(map(str, DEVICE_COUNTS)))
    parser.add_argument("--rounds", type=int, default=200,
                        help="paired steps per configuration")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(models.WORKLOADS)
    if unknown:
        parser.error(f"unknown --workloads {sorted(unknown)}; expected some "
                     f"of {list(models.WORKLOADS)}")
    engines = [e for e in args.engines.split(",") if e]
    if args.worker:
        print(json.dumps(worker(args.worker, workloads, engines, args.rounds)))
        return 0
    rows = []
    load_before = os.getloadavg()[0]
    for n in [int(d) for d in args.devices.split(",")]:
        done = subprocess.run(
            [sys.executable, "-m", "bench.monitor_cost", "--worker", str(n),
             "--workloads", ",".join(workloads), "--engines",
             ",".join(engines), "--rounds", str(args.rounds)],
            stdout=subprocess.PIPE, text=True, check=False,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if done.returncode:
            raise SystemExit(f"monitor_cost worker on {n} devices failed")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    report.write_results(
        args.output, {"rows": rows, "load_1min_before": load_before,
                      "load_1min_after": os.getloadavg()[0]},
        markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
