"""What the studies of `bench/` share: a median's interval, their output files.

Each study (`python -m bench.<study>`) writes `results.json` and
`results.md` into its output directory (`write_results`); ratios of paired
timings carry a bootstrap interval of their median (`median_interval`).
"""

import json
import math
import os
import random
import statistics

# Resamples of the rounds for a ratio's confidence interval.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def median_interval(values, resamples=BOOTSTRAP_RESAMPLES,
                    confidence=CONFIDENCE, seed=0):
    """A percentile-bootstrap confidence interval of the median.

    It reflects how much the rounds disagree, not what differs between two
    processes (see the twin configuration) or between runs.

    Returns:
        `(low, high)`, NaN for fewer than 3 values.
    """
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 3:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values)))
        for _ in range(resamples))
    tail = (1 - confidence) / 2
    return (medians[int(tail * (resamples - 1))],
            medians[int((1 - tail) * (resamples - 1))])


def whole_over_split(whole_ms, split_ms):
    """Summarises paired timings of a whole computation and of its split.

    Args:
        whole_ms: Milliseconds of the whole computation, one per pair.
        split_ms: Milliseconds of the split one, taken in turn with them.

    Returns:
        A dict: the medians `whole_ms` and `split_ms`, and `ratio` and
        `ratio_range`, the median and range of `whole / split` per pair
        (above 1: the split is faster).

    Example:
    >>> whole_over_split([10.0, 12.0], [20.0, 12.0])["ratio_range"]
    [0.5, 1.0]
    """
    ratios = [w / s for w, s in zip(whole_ms, split_ms)]
    return {"whole_ms": statistics.median(whole_ms),
            "split_ms": statistics.median(split_ms),
            "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)]}


def whole_over_split_cells(row):
    """The Markdown cells of `whole_over_split`'s dict: ms, ms, ratio [range]."""
    low, high = row["ratio_range"]
    return (f"{row['whole_ms']:.1f} | {row['split_ms']:.1f} | "
            f"{row['ratio']:.2f}x [{low:.2f}, {high:.2f}]")


def write_results(directory, data, text):
    """Writes a side benchmark's `results.json` and `results.md`, prints the text.

    Args:
        directory: Output directory, created if missing.
        data: What `results.json` holds (anything `json` can write).
        text: The Markdown of `results.md`, printed too.

    Example:
    >>> write_results("out/kernel-floor", {"rows": rows}, markdown(rows))
    """
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "results.json"), "w") as handle:
        json.dump(data, handle, indent=1)
    with open(os.path.join(directory, "results.md"), "w") as handle:
        handle.write(text)
    print(text)
