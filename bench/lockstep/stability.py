"""How steady this machine's CPUs are: the noise a benchmark starts from.

A virtual machine's cores are shared with its host's other tenants, and its
load average does not show it (steal time is often not reported). One
process per core counts loop iterations in short windows; how far windows
fall below the best one is the CPU time the machine took away meanwhile.
"""

import multiprocessing
import os
import statistics
import time


def _count_windows(seconds, window, queue):
    counts = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        stop = time.perf_counter() + window
        count = 0
        while time.perf_counter() < stop:
            count += 1
        counts.append(count)
    queue.put(counts)


def cpu_availability(seconds=3.0, window=0.1, processes=None):
    """Share of the best window's CPU speed that the windows got.

    Args:
        seconds: How long to measure.
        window: Length of one window, in seconds.
        processes: Busy processes, one per core by default.

    Returns:
        A dict with `median` and `p10` (10th percentile) of the windows'
        speed as a fraction of the fastest window, over all processes.

    Example:
    >>> cpu_availability(seconds=1.0)["median"] <= 1.0
    True
    """
    processes = processes or os.cpu_count() or 1
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_count_windows,
                               args=(seconds, window, queue))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    counts = [c for _ in workers for c in queue.get()]
    for worker in workers:
        worker.join()
    best = max(counts)
    shares = sorted(c / best for c in counts)
    return {"median": statistics.median(shares),
            "p10": shares[int(0.1 * (len(shares) - 1))]}


def describe(availability):
    """`median 0.91, 10th percentile 0.62 of the fastest 100 ms window`."""
    return (f"median {availability['median']:.2f}, 10th percentile "
            f"{availability['p10']:.2f} of the fastest 100 ms window")
