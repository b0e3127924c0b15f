"""Prototype A/B (branch stateless-step): unguarded x2, fully gated x2, stateless x2 in one process, steps in turn.

    python bench/stateless_ab.py DEVICES WORKLOADS ENGINES ROUNDS
"""
# ruff: noqa: E402, E731, B023
import random
import statistics
import sys

n = int(sys.argv[1])
workloads = sys.argv[2].split(",")
engines = sys.argv[3].split(",")
rounds = int(sys.argv[4])

import multigpu

DEVICES = multigpu.virtual_devices(n)
import warnings

warnings.simplefilter("ignore", UserWarning)
import keras

from bench import guard_cost, models, report
from multigpu import training_step

rows = []
for workload in workloads:
    for engine in engines:
        keras.utils.set_random_seed(0)
        x_all, y_all = models.load_data(workload)
        batch = models.WORKLOADS[workload].batch_size
        x, y = x_all[:batch], y_all[:batch]
        weights = models.build_model(workload).get_weights()
        steps = {}
        for i in range(2):
            for kind in ("off", "gated", "stateless"):
                m = guard_cost._model(workload, DEVICES, engine, kind != "off", weights)
                training_step.STATELESS = kind == "stateless"
                steps[f"{kind}{i}"] = guard_cost._step(m, x, y)
        names = list(steps)
        sec = {k: [] for k in names}
        order = random.Random(0)
        for _ in range(rounds):
            order.shuffle(names)
            for k in names:
                sec[k].append(guard_cost._timed(steps[k]))
        def mean(kind, r):
            return (sec[f"{kind}0"][r] + sec[f"{kind}1"][r]) / 2
        row = {"workload": workload, "engine": engine, "devices": n}
        for kind in ("gated", "stateless"):
            ratios = [mean(kind, r) / mean("off", r) for r in range(rounds)]
            lo, hi = report.median_interval(ratios)
            row[kind] = (statistics.median(ratios), lo, hi)
        ratios = [mean("stateless", r) / mean("gated", r) for r in range(rounds)]
        row["stateless/gated"] = (statistics.median(ratios),) + tuple(report.median_interval(ratios))
        nulls = [sec["off0"][r] / sec["off1"][r] for r in range(rounds)]
        row["null"] = (statistics.median(nulls),) + tuple(report.median_interval(nulls))
        row["off_ms"] = 1e3 * statistics.median(mean("off", r) for r in range(rounds))
        rows.append(row)
        f = lambda t: f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"
        print(f"| {workload} | {engine} | {n} | {row['off_ms']:.2f} | {f(row['gated'])} | {f(row['stateless'])} | {f(row['stateless/gated'])} | {f(row['null'])} |", flush=True)
