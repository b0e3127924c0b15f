"""What each replica costs per step regardless of its rows.

    python -m bench.fixed_cost --output docs/bench/fixed-cost

For 2, 4 and 8 logical CPU devices (one process each) and 1, 8 and 32 rows
per replica, trains the benchmark's demo model with the default engine and
plain Keras on the same global batch, and reports per step:

* nodes executed (partition graphs), inside the template's layers and
  outside them: the engine's extra nodes per replica do not depend on rows;
* kernel time (TensorFlow profiler, summed over `--steps` steps): the
  extra microseconds per replica per step, split into the model's own ops
  (inside the template's layers) and the engine's plumbing (slicing, the
  handling of empty shares, transfers, concatenation, gradient sums);
* wall-clock step time (median), which the shared machine makes noisy;
* the wall-clock cost of each replica beyond the first, from steps taken in
  turn, in one process, by the same template replicated on `n` devices and
  on one device (a `ParallelModel` over the first device): `(t_n - t_1) /
  (n - 1)` per round, its median and quartiles over the rounds. Both see
  the same load, so this is the number that survives a busy machine.

Op counts are exact; times are CPU kernel times under whatever load the
machine has (stated in the output).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from bench import report

DEVICE_COUNTS = (2, 4, 8)
ROWS_PER_REPLICA = (1, 8, 32)


def _load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _measure(model, x, y, steps):
    from multigpu import placement

    model.train_on_batch(x, y)
    model.train_function = None
    _, nodes = placement.executed_nodes(lambda: model.train_on_batch(x, y))
    layer_names = {layer.name for layer in _template(model).layers}

    def in_layers(name):
        # Graph name scopes are the layers' names, made unique ("dense_1").
        return any(re.sub(r"_[0-9]+$", "", part) in layer_names
                   or part in layer_names for part in name.split("/")[:-1])

    model_ops = sum(1 for n in nodes if in_layers(n.name))
    other_ops = len(nodes) - model_ops
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        walls.append(time.perf_counter() - start)

    def run():
        for _ in range(steps):
            model.train_on_batch(x, y)

    seconds = placement.op_seconds(run) or {}
    own = sum(v for k, v in seconds.items() if in_layers(k))
    return {"model_nodes": model_ops, "other_nodes": other_ops,
            "kernel_us": 1e6 * sum(seconds.values()) / steps,
            "model_kernel_us": 1e6 * own / steps,
            "wall_ms": 1e3 * statistics.median(walls)}


def _alternating(models_by_name, x, y, rounds):
    """Per-step wall seconds of each model, one step of each in turn.

    Returns:
        `{name: [seconds per round]}`.
    """
    import tensorflow as tf

    functions = {}
    for name, model in models_by_name.items():
        model.train_on_batch(x, y)
        model.make_train_function()
        data = tf.data.Dataset.from_tensors((tf.constant(x), tf.constant(y)))
        iterator = iter(data.repeat())
        for _ in range(5):
            model.train_function(iterator)
        functions[name] = (model.train_function, iterator)
    seconds = {name: [] for name in models_by_name}
    for _ in range(rounds):
        for name, (function, iterator) in functions.items():
            start = time.perf_counter()
            logs = function(iterator)
            for value in tf.nest.flatten(logs):
                value.numpy()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def _quartiles(values):
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def _template(model):
    return getattr(model, "template", model)


def worker(n, rows_list, steps, workload="demo", rounds=200):
    import multigpu

    devices = multigpu.virtual_devices(n)
    import warnings

    import keras

    from bench import models

    warnings.simplefilter("ignore", UserWarning)
    x_all, y_all = models.load_data(workload)
    out = []
    for rows in rows_list:
        x, y = x_all[: rows * n], y_all[: rows * n]
        plain = models.build_model(workload)
        plain.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        keras.utils.set_random_seed(0)
        template = models.build_model(workload)
        parallel = multigpu.multi_gpu_model(template, gpus=devices)
        parallel.compile(optimizer="sgd",
                         loss="sparse_categorical_crossentropy")
        one = multigpu.ParallelModel(models.build_model(workload),
                                     devices[:1])
        one.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        load = _load()
        p = _measure(plain, x, y, steps)
        r = _measure(parallel, x, y, steps)
        turns = _alternating({"plain": plain, "one": one, "n": parallel},
                             x, y, rounds)
        per_replica = [(tn - t1) / (n - 1) for tn, t1 in
                       zip(turns["n"], turns["one"])]
        out.append({
            "devices": n, "rows_per_replica": rows, "load_1min": load,
            "plain": p, "replicate": r,
            # Nodes outside the template's layers (slicing, empty shares, transfers,
            # concatenation, gradient sums, optimizer), beyond plain's.
            "extra_nodes_per_replica":
                (r["other_nodes"] - p["other_nodes"]) / n,
            "model_nodes_per_replica": r["model_nodes"] / n,
            "plain_model_nodes": p["model_nodes"],
            "plumbing_kernel_us_per_replica":
                (r["kernel_us"] - r["model_kernel_us"]
                 - (p["kernel_us"] - p["model_kernel_us"])) / n,
            "wall_ratio": p["wall_ms"] / r["wall_ms"],
            "workload": workload,
            "alternating_rounds": rounds,
            "alternating_ms": {k: 1e3 * statistics.median(v)
                               for k, v in turns.items()},
            "replica_wall_us_quartiles": [
                1e6 * q for q in _quartiles(per_replica)],
            "load_1min_after": _load(),
        })
    return out


def markdown_alternating(rows):
    """The per-replica wall-clock cost, from steps taken in turn."""
    lines = [
        "| workload | devices | rows/replica | plain step (ms) "
        "| engine on 1 device (ms) | engine on n devices (ms) "
        "| µs per replica beyond the first: median [quartiles] "
        "| load (1 min) |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        ms = r["alternating_ms"]
        low, mid, high = r["replica_wall_us_quartiles"]
        lines.append(
            f"| {r['workload']} | {r['devices']} | {r['rows_per_replica']} | "
            f"{ms['plain']:.2f} | {ms['one']:.2f} | {ms['n']:.2f} | "
            f"{mid:.0f} [{low:.0f}, {high:.0f}] | "
            f"{r['load_1min']:.1f}-{r['load_1min_after']:.1f} |")
    return "\n".join(lines) + "\n"


def markdown(rows):
    lines = [
        "| devices | rows/replica | model nodes/replica (plain: whole step) "
        "| extra nodes/replica | extra kernel µs/replica outside the layers "
        "| plain step (ms) | default engine step (ms) | plain/engine "
        "| load (1 min) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['devices']} | {r['rows_per_replica']} | "
            f"{r['model_nodes_per_replica']:.0f} ({r['plain_model_nodes']}) | "
            f"{r['extra_nodes_per_replica']:.1f} | "
            f"{r['plumbing_kernel_us_per_replica']:.0f} | "
            f"{r['plain']['wall_ms']:.2f} | {r['replicate']['wall_ms']:.2f} | "
            f"{r['wall_ratio']:.2f}x | {r['load_1min']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.fixed_cost")
    parser.add_argument("--output", default="out/fixed-cost")
    parser.add_argument("--devices", default=",".join(map(str, DEVICE_COUNTS)))
    parser.add_argument("--rows", default=",".join(map(str, ROWS_PER_REPLICA)))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=200,
                        help="steps of each model taken in turn")
    parser.add_argument("--workload", default="demo")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows_list = [int(r) for r in args.rows.split(",")]
    if args.worker:
        print(json.dumps(worker(args.worker, rows_list, args.steps,
                                args.workload, args.rounds)))
        return 0
    rows = []
    for n in [int(d) for d in args.devices.split(",")]:
        done = subprocess.run(
            [sys.executable, "-m", "bench.fixed_cost", "--worker", str(n),
             "--rows", args.rows, "--steps", str(args.steps),
             "--workload", args.workload, "--rounds", str(args.rounds)],
            capture_output=True, text=True, check=False,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if done.returncode:
            sys.stderr.write(done.stderr[-3000:])
            raise SystemExit(f"worker on {n} devices failed")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    report.write_results(args.output, rows,
                         markdown(rows) + "\n" + markdown_alternating(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
