"""What placing a batch costs when JAX spans several processes.

    python -m bench.jax_process_placement --output docs/bench/jax-process-placement

Starts itself as 2 workers of `multigpu.launch` on Keras's JAX backend, each
with 2 simulated CPU devices, joined into one job of 4 devices (what
`import multigpu` does under the launcher). Each worker places the same
batches split across the 4 devices two ways, alternating, round after
round: `jax.device_put`, which asserts that every process passes the same
arrays by gathering them whole, and the JAX engine's
`processes.put_global`, which agrees on each array's size and CRC-32 and then
puts only this process's shards. Worker 0 writes the median milliseconds
per batch of each, their ratio with a 95% interval over the rounds, and
the agreement alone (`check_same_batch`).
"""

import argparse
import json
import os
import statistics
import sys
import time

# (rows, features) of the batches: a small MLP batch and an MNIST-sized one.
SHAPES = ((64, 32), (256, 784))
ROUNDS = 30
CALLS = 20


def _median_ms(seconds):
    return 1e3 * statistics.median(seconds)


def _interval(ratios):
    """The median ratio and a 95% interval of it by bootstrap."""
    import numpy as np

    rng = np.random.default_rng(0)
    values = np.asarray(ratios)
    medians = np.median(rng.choice(values, (2000, values.size)), axis=1)
    return (float(np.median(values)), float(np.percentile(medians, 2.5)),
            float(np.percentile(medians, 97.5)))


def _timed(place, batch):
    import jax

    start = time.perf_counter()
    for _ in range(CALLS):
        jax.block_until_ready(place(batch))
    return (time.perf_counter() - start) / CALLS


def worker(output):
    """One worker's measurements; worker 0 writes them."""
    os.environ["KERAS_BACKEND"] = "jax"
    import multigpu

    multigpu.virtual_devices(2)
    import jax
    import numpy as np

    from multigpu.engines.jax import mesh as mesh_lib
    from multigpu.engines.jax import processes

    mesh = mesh_lib.device_mesh(multigpu.available_devices()["CPU"])
    split = mesh_lib.split_rows(mesh)
    shardings = [split, split]
    ways = {
        "device_put": lambda b: jax.device_put(b, shardings),
        "put_global": lambda b: processes.put_global(b, shardings),
        "agreement": processes.check_same_batch,
    }
    rows = []
    for shape in SHAPES:
        x = np.random.default_rng(0).standard_normal(shape).astype("float32")
        batch = [x, x[:, :4].copy()]
        for place in ways.values():  # compiled and warm
            _timed(place, batch)
        seconds = {name: [] for name in ways}
        for _ in range(ROUNDS):
            for name, place in ways.items():
                seconds[name].append(_timed(place, batch))
        ratio = _interval([a / b for a, b in zip(seconds["put_global"],
                                                 seconds["device_put"],
                                                 strict=True)])
        rows.append({"rows": shape[0], "features": shape[1],
                     "processes": jax.process_count(),
                     "devices": len(jax.devices()),
                     **{f"{name}_ms": _median_ms(s) for name, s in seconds.items()},
                     "ratio": ratio})
    if jax.process_index() == 0:
        _write(output, rows)


def _write(output, rows):
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = [
        "| batch | processes x devices | jax.device_put (ms) | put_global (ms) "
        "| put_global / device_put: median [95% interval] | agreement alone (ms) |",
        "|---|---|---:|---:|---|---:|",
    ]
    for row in rows:
        median, low, high = row["ratio"]
        lines.append(
            f"| {row['rows']} x {row['features']} float32 + {row['rows']} x 4 "
            f"| {row['processes']} x {row['devices'] // row['processes']} "
            f"| {row['device_put_ms']:.2f} | {row['put_global_ms']:.2f} "
            f"| {median:.3f} [{low:.3f}, {high:.3f}] | {row['agreement_ms']:.2f} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(output, "results.md"), "w") as f:
        f.write(text)
    print(text, end="")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/bench/jax-process-placement")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.output)
        return 0
    from multigpu import launch

    return launch.launch_command(
        [sys.executable, "-u", "-m", "bench.jax_process_placement", "--worker",
         "--output", args.output], workers=2, timeout=1800)


if __name__ == "__main__":
    sys.exit(main())
