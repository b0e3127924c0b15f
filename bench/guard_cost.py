"""What the NaN/inf guard of the engines' training step costs per step.

    python -m bench.guard_cost --output docs/bench/guard-cost

The engines' training step checks every floating-point tensor of its
share of the batch for NaN and inf, and every write of the step (the
update, the captured writes of the forward pass, the metrics) waits for
one assertion that every share was finite; the forward pass and the
gradients run beside the check (`multigpu.step.train_step`). For each
workload of `bench/models.py`, engine and device count, one process (its
logical CPU devices fixed at start) builds the same template four times
with the same weights, two models with the guard (`check_finite=True`)
and two without (`check_finite=False`), and times their steps side by side:

* **paired steps**: one training step of each model in turn (`train_function`
  on a repeated batch, as `bench.fixed_cost` does), the order shuffled
  every round, `--rounds` rounds after a warm-up; per round the ratio of the
  guarded steps' mean to the unguarded steps' mean. All see the same load,
  so the median ratio and its 95% bootstrap interval survive a busy machine
  better than separate runs would;
* **the null**: the same ratio between the two unguarded models. Two models
  that are the same can differ by a percent or two in one process; this
  column says how far from 1.0 the run puts "no difference";
* **the guard alone**: `multigpu.step.nonfinite.check` of the same batch and identities of what it
  passes on, in a
  `tf.function` of its own, paired with the same function without it
  (identities only) and net of it: what the check's ops cost without the
  step around them, free of most of the step's noise.

The cost in percent of a step is `(guarded / unguarded - 1) x 100` from the
paired steps, and `guard alone / unguarded step x 100`.
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
ENGINES = ("replicate", "mirrored")
# Guarded and unguarded models per configuration (see `measure`).
TWINS = 2


def _step(model, x, y):
    """A function taking one training step of `model` on the batch `(x, y)`."""
    import tensorflow as tf

    model.make_train_function()
    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    function = model.train_function

    def step():
        logs = function(iterator)
        for value in tf.nest.flatten(logs):
            value.numpy()

    for _ in range(5):
        step()
    return step


def _guard_alone(x, y, rounds, seed=0):
    """Seconds the guard's ops take on `(x, y)`, per call, net of the call.

    The guard runs in a `tf.function` of its own; the same function
    without the guard (identities only) is timed in turn with it, and the
    difference of each pair is the guard's: the call and fetch overheads of
    a function, which a training step pays once anyway, cancel.

    Returns:
        A list of seconds, one per round.
    """
    import tensorflow as tf

    from multigpu.step import nonfinite as finite

    @tf.function
    def guarded(x, y):
        leaves = finite.checked_leaves(x, y, None)
        verdict = finite.check([t for _, t in leaves])
        with tf.control_dependencies([verdict]):
            return [tf.identity(t) for _, t in leaves] or [tf.identity(x)]

    @tf.function
    def bare(x, y):
        leaves = finite.checked_leaves(x, y, None)
        return [tf.identity(t) for _, t in leaves] or [tf.identity(x)]

    x, y = tf.constant(x), tf.constant(y)

    def runner(function):
        def run():
            for value in function(x, y):
                value.numpy()
        for _ in range(5):
            run()
        return run

    runs = {"guarded": runner(guarded), "bare": runner(bare)}
    names, order = list(runs), random.Random(seed)
    seconds = {name: [] for name in names}
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            seconds[name].append(_timed(runs[name]))
    return [a - b for a, b in zip(seconds["guarded"], seconds["bare"])]


def _timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def paired(models_by_name, x, y, rounds, seed=0):
    """Per-round step seconds of each model, steps taken in turn.

    Args:
        models_by_name: `{"on": model, "off": model}`, compiled.
        x, y: One batch.
        rounds: Steps of each model.

    Returns:
        `{name: [seconds per round]}`.
    """
    steps = {name: _step(model, x, y) for name, model in models_by_name.items()}
    names = list(steps)
    seconds = {name: [] for name in names}
    order = random.Random(seed)
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            seconds[name].append(_timed(steps[name]))
    return seconds


def _model(workload, devices, engine, check_finite, weights):
    import keras

    import multigpu

    template = models.build_model(workload)
    template.set_weights(weights)
    model = multigpu.multi_gpu_model(template, gpus=devices, engine=engine)
    model.check_finite = check_finite
    model.compile(optimizer=keras.optimizers.SGD(1e-3),
                  loss="sparse_categorical_crossentropy")
    return model


def measure(workload, devices, engine, rounds, twins=TWINS):
    """One workload, engine and device set: the guard's cost per step.

    `twins` guarded and `twins` unguarded models of the same weights take
    their steps in turn. Two models that are the same can differ by a
    percent or two in one process (graph and memory layout), so each round
    compares the mean of the guarded steps with the mean of the unguarded
    ones, and two unguarded twins are compared the same way: that ratio is
    the run's null, what "no cost" measures.

    Args:
        workload: A key of `bench.models.WORKLOADS`.
        devices: The devices (e.g. `multigpu.virtual_devices(n)`).
        engine: An engine of `multi_gpu_model`.
        rounds: Rounds of steps (one step of every model each).
        twins: Models of each kind (at least 2).

    Returns:
        A dict of the results (milliseconds, ratios, percent).
    """
    import keras

    keras.utils.set_random_seed(0)
    x_all, y_all = models.load_data(workload)
    batch = models.WORKLOADS[workload].batch_size
    x, y = x_all[:batch], y_all[:batch]
    weights = models.build_model(workload).get_weights()
    built = {f"{kind}{i}": _model(workload, devices, engine, kind == "on",
                                  weights)
             for i in range(twins) for kind in ("on", "off")}
    seconds = paired(built, x, y, rounds)
    # Per round, the mean step of each kind.
    on, off = ([statistics.fmean(step) for step in zip(
        *(seconds[f"{kind}{i}"] for i in range(twins)))]
        for kind in ("on", "off"))
    ratios = [a / b for a, b in zip(on, off)]
    nulls = [a / b for a, b in zip(seconds["off0"], seconds["off1"])]
    low, high = report.median_interval(ratios)
    null_low, null_high = report.median_interval(nulls)
    alone_seconds = _guard_alone(x, y, rounds)
    off_ms = 1e3 * statistics.median(off)
    alone_ms = 1e3 * statistics.median(alone_seconds)
    return {
        "workload": workload, "devices": len(devices), "engine": engine,
        "rounds": rounds, "batch_size": batch, "twins": twins,
        "on_ms": 1e3 * statistics.median(on), "off_ms": off_ms,
        "ratio": statistics.median(ratios), "ratio_low": low,
        "ratio_high": high,
        "null_ratio": statistics.median(nulls), "null_low": null_low,
        "null_high": null_high, "guard_alone_ms": alone_ms,
        "guard_alone_percent": 100 * alone_ms / off_ms,
    }


def worker(n, workloads, engines, rounds):
    import multigpu

    devices = multigpu.virtual_devices(n)
    import warnings

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
        "| workload | engine | devices | step without guard (ms) "
        "| with guard (ms) | guarded / unguarded: median [95% interval] "
        "| unguarded twin / unguarded (the null) "
        "| guard alone (ms) | guard alone, % of a step |",
        "|---|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['engine']} | {r['devices']} | "
            f"{r['off_ms']:.2f} | {r['on_ms']:.2f} | {r['ratio']:.3f} "
            f"[{r['ratio_low']:.3f}, {r['ratio_high']:.3f}] | "
            f"{r['null_ratio']:.3f} [{r['null_low']:.3f}, "
            f"{r['null_high']:.3f}] | {r['guard_alone_ms']:.3f} | {r['guard_alone_percent']:.2f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.guard_cost")
    parser.add_argument("--output", default="out/guard-cost")
    parser.add_argument("--workloads", default=",".join(models.WORKLOADS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--devices", default=",".join(map(str, DEVICE_COUNTS)))
    parser.add_argument("--rounds", type=int, default=100,
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
            [sys.executable, "-m", "bench.guard_cost", "--worker", str(n),
             "--workloads", ",".join(workloads), "--engines",
             ",".join(engines), "--rounds", str(args.rounds)],
            stdout=subprocess.PIPE, text=True, check=False,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if done.returncode:
            raise SystemExit(f"guard_cost worker on {n} devices failed")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    report.write_results(
        args.output, {"rows": rows, "load_1min_before": load_before,
                      "load_1min_after": os.getloadavg()[0]},
        markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
