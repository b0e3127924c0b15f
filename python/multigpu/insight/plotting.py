"""Pictures of reports: a placement report as bars, a scaling monitor as lines.

The numbers are decided here, once, for both languages: `placement_bars`
turns a report's rows into each device's share of the weights, ops, kernel
time and transfers (with labels), `plot_placement` draws them with
matplotlib, and the R package's `plot()` method draws the same numbers with
base graphics.
"""

from multigpu.placement import format_bytes

# What a bar group shows: the metric, the report keys summed for it, and how
# one device's value is written on its bar.
METRICS = (
    ("weights", ("variable_bytes",), format_bytes),
    ("ops", ("ops",), lambda value: f"{value:.0f}"),
    ("time", ("time_share",), lambda value: f"{100 * value:.0f}%"),
    ("transfers", ("sent_bytes", "received_bytes"), format_bytes),
)

COLOURS = {
    "weights": "#1f77b4",
    "ops": "#ff7f0e",
    "time": "#2ca02c",
    "transfers": "#d62728",
}


def placement_bars(report):
    """Each device's share of what a placement report measured.

    A metric is left out when the report has no value for it (no batch:
    no ops, time or transfers; no profiler trace: no time). Each share is
    the device's value over the sum of all devices' values (0 when that
    sum is 0): balanced devices have equal bars.

    Args:
        report: What `placement_report` returned, or any sequence of row
            dicts with its keys (`device`, `variable_bytes`, `ops`,
            `time_share`, `sent_bytes`, `received_bytes`; None for unknown).

    Returns:
        A dict with `devices` (names, in the report's order) and `metrics`,
        a list of dicts with `name` (`"weights"`, `"ops"`, `"time"` or
        `"transfers"`, in that order), `values` (per device: the report's
        value, or sent plus received bytes for transfers), `shares` and
        `labels` (each value as text).

    Raises:
        TypeError: if `report` is not a sequence of row dicts.
        ValueError: if `report` has no rows.

    Example:
    >>> bars = placement_bars(report)
    >>> [metric["name"] for metric in bars["metrics"]]
    ['weights', 'ops', 'time', 'transfers']
    """
    rows = _check_rows(report)
    metrics = []
    for name, keys, label in METRICS:
        if any(row.get(key) is None for row in rows for key in keys):
            continue
        values = [sum(row[key] for key in keys) for row in rows]
        total = sum(values)
        metrics.append({
            "name": name,
            "values": values,
            "shares": [value / total if total else 0.0 for value in values],
            "labels": [label(value) for value in values],
        })
    return {"devices": [row["device"] for row in rows], "metrics": metrics}


def _check_rows(report):
    if isinstance(report, (str, bytes, dict)) or not hasattr(report, "__len__"):
        raise TypeError(
            f"Invalid `report`: received an object of type {type(report).__name__}; "
            "expected what placement_report() returned."
        )
    rows = list(report)
    if not all(isinstance(row, dict) and "device" in row for row in rows):
        raise TypeError(
            "Invalid `report`: its rows must be dicts with a `device` key, as "
            "placement_report() returns them."
        )
    if not rows:
        raise ValueError("Invalid `report`: received a report without devices.")
    return rows


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "matplotlib":
            raise
        raise ModuleNotFoundError(
            "multigpu.plot_placement needs matplotlib, which is not installed "
            "in this Python. Install it with the `plot` extra: "
            "`pip install \"multigpu[plot]\"` (from a checkout, "
            "`pip install -e \".[plot]\"`), or `pip install matplotlib`.",
            name="matplotlib",
        ) from error
    return plt


def plot_placement(report, ax=None):
    """Draws a placement report: one group of bars per device.

    Each device's bars are its share of the model's weight bytes, of the
    ops of the observed step, of the step's kernel time and of the bytes
    moved between devices (sent plus received), each labelled with the
    device's own value. A device using its share of the work has bars near
    `1 / devices`; an idle device has none.

    Args:
        report: What `placement_report` returned (with or without a batch).
        ax: A matplotlib `Axes` to draw on, or None for a new figure.

    Returns:
        The matplotlib `Axes`, with one `BarContainer` per metric (in the
        order of `placement_bars`) and one x tick per device.

    Raises:
        ModuleNotFoundError: if matplotlib is not installed (the `plot`
            extra).
        TypeError, ValueError: as `placement_bars`.

    Example:
    >>> report = multigpu.placement_report(parallel, x[:64], y[:64],
    ...                                    print_table=False)
    >>> ax = multigpu.plot_placement(report)
    >>> ax.figure.savefig("placement.png")
    """
    bars = placement_bars(report)
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 1.5 * len(bars["devices"]), 3.6))
    metrics = bars["metrics"]
    width = 0.8 / len(metrics)
    for i, metric in enumerate(metrics):
        positions = [d + (i - (len(metrics) - 1) / 2) * width
                     for d in range(len(bars["devices"]))]
        container = ax.bar(positions, metric["shares"], width,
                           label=metric["name"],
                           color=COLOURS[metric["name"]])
        ax.bar_label(container, labels=metric["labels"], fontsize=7,
                     rotation=90, padding=2)
    ax.set_xticks(range(len(bars["devices"])))
    ax.set_xticklabels([device.replace("/device:", "") for device in bars["devices"]])
    ax.set_ylabel("share of all devices")
    ax.set_ylim(0, 1.25)
    ax.legend(ncols=len(metrics), loc="upper center", frameon=False, fontsize=8)
    return ax


def scaling_lines(summary, history):
    """The lines `plot_scaling` draws, decided once for both languages.

    Args:
        summary: `ScalingMonitor.summary()`.
        history: `ScalingMonitor.history()`.

    Returns:
        A dict: `steps` and `samples_per_second` (per measured step), and
        `levels`, a list of `(label, samples per second)` for the
        horizontal lines: the one-device baseline and the ideal (the
        baseline times the devices), when a baseline was measured.

    Example:
    >>> scaling_lines(monitor.summary(), monitor.history())["levels"]
    [('one device', 2051.2...), ('ideal, 2 devices', 4102.4...)]
    """
    levels = []
    baseline = summary.get("baseline_samples_per_second")
    if baseline:
        levels.append(("one device", baseline))
        levels.append((f"ideal, {summary['devices']} devices",
                       baseline * summary["devices"]))
    return {"steps": list(history["step"]),
            "samples_per_second": list(history["samples_per_second"]),
            "levels": levels}


def plot_scaling(monitor, ax=None):
    """Draws a `ScalingMonitor`'s samples per second, step by step.

    One line for the measured steps (the rows of a batch over each step's
    time), and dashed horizontal lines for the one-device baseline and the
    ideal (the baseline times the devices); the title gives the speed-up
    and efficiency.

    Args:
        monitor: A `ScalingMonitor` that watched a `fit`.
        ax: A matplotlib `Axes`, or None for a new figure.

    Returns:
        The `Axes`: its first line is the measured steps, then one line per
        level of `scaling_lines`.

    Raises:
        ModuleNotFoundError: if matplotlib is not installed.
        ValueError: if the monitor has measured no step yet.

    Example:
    >>> ax = multigpu.insight.plotting.plot_scaling(monitor)
    >>> ax.figure.savefig("scaling.png")
    """
    summary = monitor.summary()
    lines = scaling_lines(summary, monitor.history())
    if not lines["steps"]:
        raise ValueError(
            "Invalid `monitor`: it has measured no step after its warm-up; "
            "plot it after a fit of a few steps.")
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(lines["steps"], lines["samples_per_second"], marker=".",
            label=f"{summary['devices']} devices ({summary['engine']})")
    for (label, level), style in zip(lines["levels"], ("--", ":")):
        ax.axhline(level, linestyle=style, color="grey", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("samples per second")
    ax.set_ylim(bottom=0)
    if summary["speedup"] is not None:
        ax.set_title(f"speed-up {summary['speedup']:.2f}, efficiency "
                     f"{summary['efficiency']:.2f}")
    ax.legend(frameon=False, fontsize=8)
    return ax
