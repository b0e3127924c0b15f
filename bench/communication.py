"""Bytes per training step per engine, the all-reduce bound, 8-GPU predictions.

    python -m bench.communication --output docs/bench/communication
    python -m bench.communication --quick --output out/communication

For each workload (the benchmark's three and a ResNet-50-sized model:
ResNet-50's 25M weights in two dense layers; `--workloads resnet50` counts
the real network, which takes about an hour per count on 2 shared cores) and
2, 4 and 8 logical CPU devices, one process per device count counts the
bytes one training step moves between devices
(`multigpu.placement.step_traffic`) for each engine of `multi_gpu_model`
and for `model_parallel`, and times the plain model's step on one
replica's rows. `multigpu.insight.scaling.predict_step` turns those into step
times and speed-ups on PCIe 4.0, NVLink 3 and NVLink 4. Byte counts are
exact (they do not depend on the machine's load); compute times do.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench import report

WORKLOADS = ("demo", "cnn", "mlp_large", "resnet50_sized")
# Selectable with --workloads: a real ResNet-50 (an hour per count here).
EXTRA_WORKLOADS = ("resnet50",)
DEVICE_COUNTS = (2, 4, 8)
ENGINES = ("replicate", "mirrored", "model_parallel")
# Rows per replica: 32 (a common per-GPU batch); ResNet-50's step is
# counted on 2 rows per replica (one CPU step of 32 x 8 images at 224x224
# takes minutes here) and its row-proportional bytes scaled to 32.
ROWS_PER_REPLICA = {"demo": 32, "cnn": 32, "mlp_large": 32,
                    "resnet50_sized": 32, "resnet50": 2}
TARGET_ROWS = 32
# Row-proportional kinds of traffic.
PER_ROW_KINDS = ("activations", "activation gradients")
LINK_NAMES = ("pcie4", "nvlink3", "nvlink4")
HOST = "/device:CPU:0"
# ResNet-50 training on one A100 (TF32, about 800 images/s in NVIDIA's
# published TensorFlow figures): 32 images in about 40 ms.
RESNET50_GPU_SECONDS = 0.040


def _model_and_data(workload, rows):
    import numpy as np

    if workload == "resnet50_sized":
        # ResNet-50's weight bytes (25.0M trainable parameters against its
        # 25.6M) in two dense layers over its 2,048 pooled features: the
        # bytes of weights, gradients and all-reduce of a ResNet-50 step,
        # counted in seconds instead of the hour a ResNet-50 step with the
        # debugger takes on this shared CPU.
        import keras

        inputs = keras.Input((2048,), name="features")
        hidden = keras.layers.Dense(8192, activation="relu")(inputs)
        outputs = keras.layers.Dense(1000, activation="softmax")(hidden)
        rng = np.random.default_rng(0)
        x = rng.random((rows, 2048), dtype=np.float32)
        y = rng.integers(0, 1000, size=rows, dtype=np.int32)
        return keras.Model(inputs, outputs, name="resnet50_sized"), x, y
    if workload == "resnet50":
        import keras

        model = keras.applications.ResNet50(
            weights=None, input_shape=(224, 224, 3), classes=1000)
        rng = np.random.default_rng(0)
        x = rng.random((rows, 224, 224, 3), dtype=np.float32)
        y = rng.integers(0, 1000, size=rows, dtype=np.int32)
        return model, x, y
    from bench import models

    x, y = models.load_data(workload)
    return models.build_model(workload), x[:rows], y[:rows]


def _compile(model):
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def _engine_model(engine, workload, devices):
    import multigpu

    template, _, _ = _model_and_data(workload, 1)
    if engine == "model_parallel":
        return _compile(multigpu.model_parallel(template, devices=devices))
    return _compile(multigpu.multi_gpu_model(template, gpus=devices,
                                             engine=engine))


def _compute_seconds(workload, rows, repeats):
    """Median train_on_batch time of the plain model on one replica's rows."""
    model, x, y = _model_and_data(workload, rows)
    _compile(model)
    model.train_on_batch(x, y)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(workload, num_devices, engines, repeats):
    """Counts one workload's bytes on `num_devices` devices; JSON rows."""
    import multigpu

    devices = multigpu.virtual_devices(num_devices)
    import warnings

    from multigpu import placement
    from multigpu.placement import traffic as traffic_lib

    warnings.simplefilter("ignore", UserWarning)
    rows = ROWS_PER_REPLICA[workload]
    results = []
    for engine in engines:
        model = _engine_model(engine, workload, devices)
        _, x, y = _model_and_data(workload, rows * num_devices)
        started = time.perf_counter()
        transfers = placement.step_traffic(model, x, y)
        by_device = traffic_lib.bytes_by_device(transfers)
        results.append({
            "workload": workload, "engine": engine, "devices": num_devices,
            "rows_per_replica": rows,
            "gradient_bytes": placement.gradient_bytes(model),
            "by_kind": traffic_lib.bytes_by_kind(transfers),
            "by_device": {d: list(v) for d, v in by_device.items()},
            "unknown_sizes": sum(t.bytes is None for t in transfers),
            "count_seconds": time.perf_counter() - started,
        })
    compute = _compute_seconds(workload, rows, repeats)
    for row in results:
        row["compute_seconds"] = compute
    return results


def _scaled(row):
    """Per-device traffic with row-proportional kinds scaled to TARGET_ROWS.

    Only ResNet-50 is counted on fewer rows; its per-device split of the
    row-proportional kinds is taken from the counted step.
    """
    factor = TARGET_ROWS / row["rows_per_replica"]
    if factor == 1:
        return {d: tuple(v) for d, v in row["by_device"].items()}, row["by_kind"]
    by_kind = dict(row["by_kind"])
    per_row = sum(by_kind[k] for k in PER_ROW_KINDS)
    total = sum(by_kind.values()) or 1
    for k in PER_ROW_KINDS:
        by_kind[k] *= factor
    # Scale each device's traffic by the share that is row-proportional.
    grow = 1 + (factor - 1) * per_row / total
    return ({d: (s * grow, r * grow) for d, (s, r) in row["by_device"].items()},
            by_kind)


def extrapolate(row, n):
    """A 2-device count carried to `n` devices by the counted structure.

    For workloads too slow to count on more devices here. The structure is
    the one `tests/python/test_communication.py` checks exactly on 2 and 4
    devices: the replicate engine's host sends each other replica what it
    sent the one at 2 devices (weights, input rows, output gradients) and
    receives from each what it received (outputs, gradients); the
    mirrored engine all-reduces the same buffer `C` (`2 (n-1)/n x C` per
    device) and, under `train_on_batch`, sends every replica the whole
    batch (n replicas' rows).

    Returns:
        A row like a counted one, with `"extrapolated_from": 2`.
    """
    from multigpu.placement import traffic as traffic_lib

    if row["devices"] != 2 or row["engine"] not in ("replicate", "mirrored"):
        raise ValueError(f"cannot extrapolate {row['engine']} from "
                         f"{row['devices']} devices")
    others = [f"/device:CPU:{i}" for i in range(1, n)]
    host_sent, host_received = row["by_device"][HOST]
    if row["engine"] == "replicate":
        by_device = {HOST: [(n - 1) * host_sent, (n - 1) * host_received]}
        by_device.update({d: [host_received, host_sent] for d in others})
        by_kind = {k: (n - 1) * v for k, v in row["by_kind"].items()}
    else:
        buffer = row["by_kind"]["all-reduce"] / 2  # ring(C, 2) = C per device
        ring = traffic_lib.ring_allreduce_bytes(buffer, n)
        batch = row["by_kind"]["activations"] * n / 2  # whole batch, n replicas
        by_device = {HOST: [(n - 1) * batch + ring, ring]}
        by_device.update({d: [ring, batch + ring] for d in others})
        by_kind = dict(row["by_kind"], activations=(n - 1) * batch,
                       **{"all-reduce": n * ring})
    return dict(row, devices=n, by_device=by_device, by_kind=by_kind,
                extrapolated_from=2)


def _as_fit(row, traffic):
    """The mirrored engine's traffic with `fit`'s input split.

    `train_on_batch` under a strategy sends the whole batch to every
    replica; `fit` sends each replica its rows, `1/n` of it. Each non-host
    device's received activations (the batch, `A / (n - 1)` of the total
    `A`) shrink to `1/n` of that, and the host sends that much less.
    """
    n = row["devices"]
    batch_share = row["by_kind"]["activations"] * (
        TARGET_ROWS / row["rows_per_replica"]) / (n - 1)
    saved = batch_share * (1 - 1 / n)
    adjusted = {}
    for device, (sent, received) in traffic.items():
        if device == HOST:
            adjusted[device] = (sent - saved * (n - 1), received)
        else:
            adjusted[device] = (sent, received - saved)
    return adjusted


def predictions(rows):
    """Predicted step time and speed-up per row, engine variant and link."""
    # One compute time per workload: the fastest of its processes' medians
    # (the least disturbed by the machine's other load).
    fastest = {}
    for row in rows:
        fastest[row["workload"]] = min(
            fastest.get(row["workload"], float("inf")), row["compute_seconds"])
    out = []
    for row in rows:
        if row["engine"] == "model_parallel":
            continue  # stages run one after another: no data-parallel speed-up
        row = dict(row, compute_seconds=fastest[row["workload"]])
        traffic, _ = _scaled(row)
        variants = [(row["engine"], traffic)]
        if row["engine"] == "mirrored":
            variants.append(("mirrored, fit's input split",
                             _as_fit(row, traffic)))
        for engine, engine_traffic in variants:
            out += _predict(row, engine, engine_traffic)
    return out


def _predict(row, engine, traffic):
    """One configuration's predictions on every link and compute time."""
    from multigpu.insight import scaling
    from multigpu.placement import traffic as traffic_lib

    # Compute time of one replica's TARGET_ROWS rows: measured on this CPU
    # (scaled linearly from the counted rows), and for ResNet-50 an A100's.
    compute_times = [("cpu", row["compute_seconds"]
                      * TARGET_ROWS / row["rows_per_replica"])]
    if row["workload"] in ("resnet50", "resnet50_sized"):
        compute_times.append(("gpu", RESNET50_GPU_SECONDS))
    out = []
    for link in LINK_NAMES:
        for label, seconds in compute_times:
            p = scaling.predict_step(traffic, seconds, link,
                                     devices=row["devices"])
            out.append({
                "workload": row["workload"], "engine": engine,
                "devices": row["devices"], "link": link,
                "compute": label, "compute_seconds": seconds,
                "comm_seconds": p.comm_seconds, "speedup": p.speedup,
                "bound_seconds": traffic_lib.ring_allreduce_bytes(
                    row["gradient_bytes"], row["devices"])
                / scaling.LINKS[link].bandwidth,
            })
    return out


def _mib(n):
    return f"{n / 2**20:.2f}"


def markdown(rows, preds):
    """The communication tables as Markdown."""
    from multigpu.insight import scaling
    from multigpu.placement import traffic as traffic_lib

    lines = ["### Bytes per training step (MiB), busiest device vs the bound",
             "",
             "| workload | engine | devices | weights | activations | act. grads "
             "| gradients | all-reduce | busiest device | ring bound |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        traffic, by_kind = _scaled(row)
        busiest = scaling.busiest_bytes(traffic)
        bound = traffic_lib.ring_allreduce_bytes(row["gradient_bytes"],
                                                   row["devices"])
        mark = " (extrapolated)" if row.get("extrapolated_from") else ""
        lines.append(
            f"| {row['workload']} | {row['engine']} | {row['devices']}{mark} | "
            + " | ".join(_mib(by_kind[k]) for k in traffic_lib.KINDS)
            + f" | {_mib(busiest)} | {_mib(bound)} |")
    lines += ["", "### Predicted speed-up (per-replica batch 32; step time on "
              "PCIe 4.0 in brackets)", "",
              "| workload | engine | compute / step | devices | "
              + " | ".join(scaling.LINKS[k].name for k in LINK_NAMES) + " |",
              "|---|---|---|---:|" + "---:|" * len(LINK_NAMES)]
    keyed = {}
    for p in preds:
        keyed.setdefault((p["workload"], p["engine"], p["compute"],
                          p["compute_seconds"], p["devices"]), {})[p["link"]] = p
    for (workload, engine, label, seconds, n), by_link in keyed.items():
        source = "this CPU" if label == "cpu" else "A100, assumed"
        step_ms = 1e3 * (by_link["pcie4"]["compute_seconds"]
                         + by_link["pcie4"]["comm_seconds"])
        lines.append(
            f"| {workload} | {engine} | {seconds * 1e3:.1f} ms ({source}) | "
            f"{n} | {by_link['pcie4']['speedup']:.2f}x ({step_ms:.1f} ms) | "
            + " | ".join(f"{by_link[k]['speedup']:.2f}x"
                         for k in LINK_NAMES[1:])
            + " |")
    return "\n".join(lines) + "\n"


def plot(rows, preds, path):
    """Bytes vs the bound, and predicted 8-device speed-ups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from multigpu.insight import scaling
    from multigpu.placement import traffic as traffic_lib

    eight = [r for r in rows if r["devices"] == 8
             and r["engine"] != "model_parallel"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{r['workload']}\n{r['engine']}" for r in eight]
    busiest = [scaling.busiest_bytes(_scaled(r)[0]) / 2**20 for r in eight]
    bound = [traffic_lib.ring_allreduce_bytes(r["gradient_bytes"], 8) / 2**20
             for r in eight]
    xs = range(len(eight))
    left.bar([x - 0.2 for x in xs], busiest, 0.4, label="busiest device")
    left.bar([x + 0.2 for x in xs], bound, 0.4, label="ring all-reduce bound")
    left.set_yscale("log")
    left.set_xticks(list(xs), [label.replace("\n", " ") for label in labels],
                    fontsize=7, rotation=35, ha="right")
    left.set_ylabel("MiB per step (8 devices)")
    left.legend()
    chosen = [p for p in preds if p["devices"] == 8 and (
        p["compute"] == "gpu"
        or p["workload"] not in ("resnet50", "resnet50_sized"))]
    combos = sorted({(p["workload"], p["engine"]) for p in chosen})
    width = 0.8 / len(LINK_NAMES)
    for i, link in enumerate(LINK_NAMES):
        values = [next(p["speedup"] for p in chosen if p["link"] == link
                       and (p["workload"], p["engine"]) == c) for c in combos]
        right.bar([j + (i - 1) * width for j in range(len(combos))], values,
                  width, label=scaling.LINKS[link].name)
    right.axhline(8, color="grey", linestyle=":", linewidth=1)
    right.set_xticks(range(len(combos)),
                     [f"{w} {e.replace(', fit' + chr(39) + 's input split', ' (fit)')}"
                      for w, e in combos],
                     fontsize=7, rotation=35, ha="right")
    right.set_ylabel("predicted speed-up, 8 devices")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.communication")
    parser.add_argument("--output", default="out/communication")
    parser.add_argument("--quick", action="store_true",
                        help="demo only, 2 devices: a smoke run")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--devices", default=",".join(map(str, DEVICE_COUNTS)))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--from-json", metavar="RESULTS_JSON",
                        help="rewrite the tables and plot from saved counts")
    parser.add_argument("--extrapolate", default="",
                        help="workloads whose 2-device counts are carried "
                        "to the --devices counts missing from --from-json")
    parser.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "DEVICES"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        workload, n = args.worker[0], int(args.worker[1])
        # ResNet-50 in stages adds nothing the dense workloads do not show
        # and costs minutes per step here.
        # model_parallel needs a layer per stage (the demo has 6).
        engines = (ENGINES[:2] if workload.startswith("resnet50") or n > 4
                   else ENGINES)
        print(json.dumps(worker(workload, n, engines, args.repeats)))
        return 0
    workloads = ["demo"] if args.quick else args.workloads.split(",")
    counts = [2] if args.quick else [int(n) for n in args.devices.split(",")]
    rows = []
    if args.from_json:
        with open(args.from_json) as handle:
            rows = json.load(handle)["counts"]
        workloads = []
    for workload in workloads:
        for n in counts:
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "bench.communication", "--worker",
                 workload, str(n), "--repeats", str(args.repeats)],
                capture_output=True, text=True, check=False,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
            if done.returncode:
                sys.stderr.write(done.stderr[-3000:])
                raise SystemExit(f"worker {workload} on {n} devices failed")
            rows += json.loads(done.stdout.strip().splitlines()[-1])
            os.makedirs(args.output, exist_ok=True)
            with open(os.path.join(args.output, "counts.partial.json"),
                      "w") as handle:
                json.dump({"counts": rows}, handle)
            print(f"{workload} on {n} devices: "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    for workload in filter(None, args.extrapolate.split(",")):
        have = {(r["engine"], r["devices"]) for r in rows
                if r["workload"] == workload}
        for base in [r for r in rows if r["workload"] == workload
                     and r["devices"] == 2 and r["engine"] != "model_parallel"]:
            for n in [int(d) for d in args.devices.split(",")]:
                if (base["engine"], n) not in have:
                    rows.append(extrapolate(base, n))
    preds = predictions(rows)
    report.write_results(args.output, {"counts": rows, "predictions": preds},
                         markdown(rows, preds))
    plot(rows, preds, os.path.join(args.output, "communication.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
