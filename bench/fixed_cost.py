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
  turn by `bench.paired`: A, the same template replicated on `n` devices,
  and B, on one device (a `ParallelModel` over the first device), with
  plain Keras beside them. `(t_n - t_1) / (n - 1)` per round, its median and
  quartiles over the rounds; the null is A's twin against A. All see the
  same load, so this is the number that survives a busy machine.

Op counts are exact; times are CPU kernel times under whatever load the
machine has (stated in the output).
"""

import re
import statistics
import sys
import time

from bench import models, paired


def _profile(model, x, y, steps):
    """Nodes executed in and outside the layers, kernel and wall time."""
    from multigpu import placement

    model.train_on_batch(x, y)
    model.train_function = None
    _, nodes = placement.executed_nodes(lambda: model.train_on_batch(x, y))
    layer_names = {layer.name for layer in getattr(model, "template", model).layers}

    def in_layers(name):
        # Graph name scopes are the layers' names, made unique ("dense_1").
        return any(re.sub(r"_[0-9]+$", "", part) in layer_names
                   or part in layer_names for part in name.split("/")[:-1])

    model_ops = sum(1 for n in nodes if in_layers(n.name))
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
    return {"model_nodes": model_ops, "other_nodes": len(nodes) - model_ops,
            "kernel_us": 1e6 * sum(seconds.values()) / steps,
            "model_kernel_us": 1e6 * own / steps,
            "wall_ms": 1e3 * statistics.median(walls)}


def _arms(case, devices):
    import keras

    import multigpu

    n, workload = len(devices), case["workload"]
    x, y = (data[: case["rows_per_replica"] * n]
            for data in models.load_data(workload))

    def plain():
        model = models.build_model(workload)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return model

    def engine(on):
        keras.utils.set_random_seed(0)
        template = models.build_model(workload)
        model = (multigpu.multi_gpu_model(template, gpus=on) if len(on) > 1
                 else multigpu.ParallelModel(template, on))
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return model

    p, r = (_profile(model, x, y, case["steps"])
            for model in (plain(), engine(devices)))
    cells = {
        "plain": p, "replicate": r,
        # Nodes outside the template's layers (slicing, empty shares, transfers,
        # concatenation, gradient sums, optimizer), beyond plain's.
        "extra_nodes_per_replica": (r["other_nodes"] - p["other_nodes"]) / n,
        "model_nodes_per_replica": r["model_nodes"] / n,
        "plumbing_kernel_us_per_replica":
            (r["kernel_us"] - r["model_kernel_us"]
             - (p["kernel_us"] - p["model_kernel_us"])) / n,
        "wall_ratio": p["wall_ms"] / r["wall_ms"]}

    def per_replica(seconds):
        beyond = [1e6 * (tn - t1) / (n - 1)
                  for tn, t1 in zip(seconds["a"], seconds["b"], strict=True)]
        low, _, high = statistics.quantiles(beyond, n=4)
        return {"replica_wall_us_quartiles": [low, statistics.median(beyond), high]}

    def step(build):
        return lambda: paired.train_step(build(), x, y)

    return paired.Arms(a=step(lambda: engine(devices)),
                       b=step(lambda: engine(devices[:1])),
                       beside={"plain": step(plain)}, cells=cells,
                       after=per_replica)


STUDY = paired.Study(
    name="fixed_cost", a="n_devices", b="one_device", arms=_arms, rounds=200,
    devices=(2, 4, 8), options={"steps": 20},
    axes=(paired.Axis("--workload", "workload", ("demo",), tuple(models.WORKLOADS)),
          paired.Axis("--rows", "rows_per_replica", (1, 8, 32), type=int)),
    tables=((paired.number("devices", "{devices}"),
             paired.number("rows/replica", "{rows_per_replica}"),
             paired.number("model nodes/replica (plain: whole step)",
                           "{model_nodes_per_replica:.0f} ({plain[model_nodes]})"),
             paired.number("extra nodes/replica", "{extra_nodes_per_replica:.1f}"),
             paired.number("extra kernel µs/replica outside the layers",
                           "{plumbing_kernel_us_per_replica:.0f}"),
             paired.number("plain step (ms)", "{plain[wall_ms]:.2f}"),
             paired.number("default engine step (ms)", "{replicate[wall_ms]:.2f}"),
             paired.number("plain/engine", "{wall_ratio:.2f}x"),
             paired.number("load (1 min)", "{load_1min:.1f}")),
            (paired.text("workload"), paired.number("devices", "{devices}"),
             paired.number("rows/replica", "{rows_per_replica}"),
             paired.number("plain step (ms)", "{plain_ms:.2f}"),
             paired.number("engine on 1 device (ms)", "{one_device_ms:.2f}"),
             paired.number("engine on n devices (ms)", "{n_devices_ms:.2f}"),
             paired.Column("µs per replica beyond the first: median [quartiles]",
                           "{replica_wall_us_quartiles[1]:.0f} "
                           "[{replica_wall_us_quartiles[0]:.0f}, "
                           "{replica_wall_us_quartiles[2]:.0f}]", "---"),
             paired.interval("n-device twin / n devices (the null)", "null"),
             paired.number("load (1 min)", "{load_1min:.1f}-{load_1min_after:.1f}"))))


def main(argv=None):
    return paired.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
