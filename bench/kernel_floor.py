"""The floor a split batch sets: the template's own kernels on sub-batches.

    python -m bench.kernel_floor --output docs/bench/kernel-floor

Any data-parallel engine runs the model's kernels once per replica on a
slice of the batch. On logical CPU devices, which share the machine's cores,
that alone can cost more than one call on the whole batch: each device owns
`cores // n` compute threads (`multigpu.virtual_devices`), and a kernel on
one thread is not always as efficient per row as one on every core. This
benchmark measures that floor without multigpu's engines on the path:

* `whole`: one process with TensorFlow's default devices; a step is the
  gradient of the loss of the whole batch with respect to the weights (one
  `tf.GradientTape`, no optimizer update).
* `split`: one process with `multigpu.virtual_devices(n)`; a step is `n`
  such gradients, each under `tf.device` of its device on its slice of the
  batch, summed on the first device: the least work any replica engine
  does.

The processes run in turn, `--pairs` times; each times `--steps` steps after
a warm-up. The ratio `whole / split` per pair (above 1: the split is
faster) is the fastest a data-parallel engine can be relative to plain
Keras on this machine, before its own plumbing.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench import models, report

DEVICE_COUNTS = (2, 4)


def _step_function(model, devices, batch_size):
    import keras
    import tensorflow as tf

    from multigpu.engines.tensorflow.forward import split_bounds

    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    weights = model.trainable_weights
    bounds = split_bounds(batch_size, len(devices))

    @tf.function
    def step(x, y):
        per_device = []
        for i, device in enumerate(devices):
            with tf.device(device):
                xs, ys = x[bounds[i]:bounds[i + 1]], y[bounds[i]:bounds[i + 1]]
                with tf.GradientTape() as tape:
                    loss = loss_fn(ys, model(xs, training=True))
                per_device.append(tape.gradient(loss, weights))
        return [tf.add_n(list(grads)) for grads in zip(*per_device)]

    return step


def worker(mode, n, workload, steps):
    """Median seconds per step of `mode` ("whole" or "split") on `n` devices."""
    devices = ["/device:CPU:0"]
    if mode == "split":
        import multigpu

        devices = multigpu.virtual_devices(n)
    import keras

    keras.utils.set_random_seed(0)
    batch_size = models.WORKLOADS[workload].batch_size
    x, y = models.load_data(workload)
    x, y = x[:batch_size], y[:batch_size]
    model = models.build_model(workload)
    step = _step_function(model, devices, batch_size)
    for _ in range(3):
        [g.numpy() for g in step(x, y)]
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        [g.numpy() for g in step(x, y)]
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _run_worker(mode, n, workload, steps):
    done = subprocess.run(
        [sys.executable, "-m", "bench.kernel_floor", "--worker", mode,
         "--devices", str(n), "--workloads", workload, "--steps", str(steps)],
        capture_output=True, text=True, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if done.returncode:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"kernel_floor worker ({mode}, {n} devices, "
                         f"{workload}) failed")
    return float(done.stdout.strip().splitlines()[-1])


def measure(workload, n, steps, pairs):
    """Per-pair step times of the whole and split processes, and their ratio."""
    whole, split = [], []
    for _ in range(pairs):
        whole.append(_run_worker("whole", n, workload, steps))
        split.append(_run_worker("split", n, workload, steps))
    return {"workload": workload, "devices": n,
            **report.whole_over_split([1e3 * s for s in whole],
                                      [1e3 * s for s in split]),
            "pairs": pairs, "steps": steps}


def markdown(rows):
    """The results as a Markdown table."""
    lines = [
        "| workload | devices | whole batch, 1 device (ms/step) "
        "| split over n devices (ms/step) | whole / split: median [range] |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['devices']} | "
                     f"{report.whole_over_split_cells(r)} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.kernel_floor")
    parser.add_argument("--output", default="out/kernel-floor")
    parser.add_argument("--workloads", default=",".join(models.WORKLOADS))
    parser.add_argument("--devices", default=",".join(map(str, DEVICE_COUNTS)))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=3,
                        help="whole/split processes run in turn")
    parser.add_argument("--worker", choices=("whole", "split"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(models.WORKLOADS)
    if unknown:
        parser.error(f"unknown --workloads {sorted(unknown)}; expected some "
                     f"of {list(models.WORKLOADS)}")
    counts = [int(d) for d in args.devices.split(",")]
    if args.worker:
        print(worker(args.worker, counts[0], workloads[0], args.steps))
        return 0
    rows = []
    for workload in workloads:
        for n in counts:
            rows.append(measure(workload, n, args.steps, args.pairs))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    report.write_results(args.output, {"rows": rows, "load_1min": os.getloadavg()[0]},
                         markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
