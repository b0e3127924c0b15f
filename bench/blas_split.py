"""Whether a row split of one matrix product pays on this CPU, without TensorFlow.

    python -m bench.blas_split --output docs/bench/blas-split

`bench.kernel_floor` finds that a wide MLP's gradients, split over logical
CPU devices, can run well below one call on the whole batch. This benchmark
asks the same question of NumPy's BLAS (OpenBLAS in NumPy's wheels), so the
answer does not depend on TensorFlow's kernels or thread pools:

* `whole`: `x @ w` on all rows, BLAS on every core;
* `split`: `x` cut into `n` row slices, the same `w` for each (what each
  replica of a data-parallel engine computes), run side by side by one
  single-threaded BLAS call per core.

Both do the same arithmetic. Each shape is timed `--rounds` times in turn;
the ratio `whole / split` per round (above 1: the split is faster) is
reported as its median and range. The shapes are `mlp_large`'s two kinds of
layer and a control whose weights fit in a core's L2 cache.
"""

import argparse
import concurrent.futures
import os
import sys
import time

import numpy as np

from bench import report

# name: (rows, inputs, outputs), as in `x @ w` with x (rows, inputs).
SHAPES = {
    "mlp_large layer 1 (256 x 3072 @ 3072 x 2048, 24 MiB of weights)": (256, 3072, 2048),
    "mlp_large hidden (256 x 2048 @ 2048 x 2048, 16 MiB of weights)": (256, 2048, 2048),
    "control (4096 x 256 @ 256 x 256, 256 KiB of weights)": (4096, 256, 256),
}


def split_product(x, w, slices, pool):
    """`x @ w` computed slice by slice of rows, the slices run by `pool`.

    The slices' products are returned as they are: stacking them would add
    a copy of the output that the whole product does not make.

    Args:
        x: Inputs, rows first.
        w: Weights.
        slices: How many row slices (replicas).
        pool: An executor whose workers each run one BLAS call at a time.

    Returns:
        The products of the row slices, in row order.

    Example:
    >>> with concurrent.futures.ThreadPoolExecutor(2) as pool:
    ...     [part.shape for part in split_product(np.eye(4), np.ones((4, 2)), 2, pool)]
    [(2, 2), (2, 2)]
    """
    return list(pool.map(lambda part: part @ w, np.array_split(x, slices)))


def _milliseconds(function, calls):
    function()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e3


def measure(shape, slices, rounds, calls, cores):
    """Times the whole product against its split for one shape.

    Args:
        shape: `(rows, inputs, outputs)`.
        slices: Row slices of the split product.
        rounds: Whole/split measurements taken in turn.
        calls: Products timed per measurement.
        cores: BLAS threads for the whole product and workers for the split.

    Returns:
        A dict with the milliseconds per product (medians) and the ratio
        `whole / split` per round (median and range).
    """
    from threadpoolctl import threadpool_limits

    rows, inputs, outputs = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, inputs), dtype=np.float32)
    w = rng.standard_normal((inputs, outputs), dtype=np.float32)
    whole, split = [], []
    with concurrent.futures.ThreadPoolExecutor(cores) as pool:
        for _ in range(rounds):
            with threadpool_limits(cores):
                whole.append(_milliseconds(lambda: x @ w, calls))
            with threadpool_limits(1):
                split.append(_milliseconds(
                    lambda: split_product(x, w, slices, pool), calls))
    return report.whole_over_split(whole, split)


def markdown(rows):
    """The results as a markdown table."""
    lines = ["| product | slices | whole, all cores (ms) | split, one core each "
             "(ms) | whole / split: median [range] |",
             "|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['slices']} | "
                     f"{report.whole_over_split_cells(r)} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.blas_split")
    parser.add_argument("--output", default="out/blas-split")
    parser.add_argument("--slices", default="2,4")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    rows = []
    for name, shape in SHAPES.items():
        for slices in (int(s) for s in args.slices.split(",")):
            row = measure(shape, slices, args.rounds, args.calls, cores)
            rows.append({"shape": name, "slices": slices, **row})
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    report.write_results(args.output, {"rows": rows, "cores": cores,
                                       "load_1min": os.getloadavg()[0],
                                       "numpy": np.__version__}, markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
