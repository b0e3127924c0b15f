"""Turns the lockstep run's measurements into CSV files, Markdown and plots."""

import csv
import math
import statistics

from bench.lockstep import plan
from bench.report import CONFIDENCE, median_interval

TARGET_WORKLOADS = ("demo", "cnn")
TARGET_DEVICES = (2, 4)
TARGET_VS_PLAIN = 0.95
# On every workload at 4 devices, small per-replica batches included.
TARGET_ALL_WORKLOADS_DEVICES = 4
TARGET_ALL_WORKLOADS_VS_PLAIN = 0.97
TARGET_R_TOLERANCE = 0.03

COLUMNS = [
    "workload", "devices", "config", "label", "runner", "engine",
    "cpu_merge", "is_default", "driver", "api", "batch_size",
    "rows_per_device", "train_samples_per_s", "train_best_samples_per_s",
    "train_vs_plain", "train_vs_plain_low", "train_vs_plain_high",
    "train_best_vs_plain", "train_vs_mirrored_by_hand",
    "train_vs_mirrored_by_hand_low", "train_vs_mirrored_by_hand_high",
    "train_vs_python",
    "train_vs_python_low", "train_vs_python_high", "train_vs_twin",
    "train_vs_twin_low", "train_vs_twin_high", "train_cpu_ms_per_1k",
    "predict_samples_per_s",
    "predict_vs_plain", "peak_rss_mib", "peak_device_mib", "rounds",
    "devices_used", "engine_used", "memory_locked", "status",
]
METADATA_COLUMNS = [
    "run_started", "mode", "device_type", "cpu_model", "cpu_cores",
    "gpu_names", "tensorflow", "keras", "python", "multigpu", "git_commit",
    "load_before", "load_after", "cpu_availability_before",
    "cpu_availability_after",
]
RAW_COLUMNS = ["workload", "devices", "config", "phase", "round", "seconds",
               "cpu_seconds", "samples_per_s", "major_faults"]


def _median(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def _rates(run, key, phase):
    """`{round: samples/s}` of one configuration in one phase."""
    ready = run.ready.get(key)
    if ready is None:
        return {}
    return {index: ready["num_samples"] / seconds
            for k, p, index, seconds, *_ in run.samples
            if k == key and p == phase}


def _cpu_ms_per_1k(run, key, phase):
    """Median CPU milliseconds (all threads) per 1,000 samples."""
    ready = run.ready.get(key)
    if ready is None:
        return float("nan")
    return _median([1e6 * cpu / ready["num_samples"]
                    for k, p, _, _, cpu, *_ in run.samples
                    if k == key and p == phase and cpu is not None])


def _round_ratios(numerator, denominator):
    """Per-round ratios of two configurations' `{round: rate}`."""
    rounds = sorted(set(numerator) & set(denominator))
    return [numerator[r] / denominator[r] for r in rounds]


def _paired_ratio(numerator, denominator):
    """Median over rounds of the ratio of two configurations' rates."""
    return _median(_round_ratios(numerator, denominator))



def _ratio_columns(name, numerator, denominator):
    """`{name, name_low, name_high}`: a paired ratio and its interval."""
    ratios = _round_ratios(numerator, denominator) if denominator else []
    low, high = median_interval(ratios)
    return {name: _median(ratios), f"{name}_low": low, f"{name}_high": high}


def _python_rates(config, configs, train):
    """Per-round rates of the Python counterpart of an R configuration.

    With a twin, the geometric mean of both Python processes, so the
    comparison leans on neither one process's luck.
    """
    counterpart = _python_counterpart(config, configs)
    if counterpart is None:
        return {}
    first = train[counterpart.key]
    second = train.get(plan.twin_key(counterpart.key))
    if not second:
        return first
    return {r: math.sqrt(first[r] * second[r]) for r in first if r in second}


def _best_ratio(numerator, denominator):
    """Ratio of the best (least disturbed) rounds of two configurations."""
    if not numerator or not denominator:
        return float("nan")
    return max(numerator.values()) / max(denominator.values())


def _python_counterpart(config, configs):
    """The Python configuration an R configuration is compared with."""
    for other in configs:
        if other.runner == "multi_gpu_model" and not other.twin and \
                other.engine == config.engine and \
                other.cpu_merge in (None, True):
            return other
    return None


def aggregate(run):
    """One result row per configuration of a `runner.GroupRun`."""
    group = run.group
    rows = []
    train = {c.key: _rates(run, c.key, "epoch") for c in group.configs}
    predict = {c.key: _rates(run, c.key, "predict") for c in group.configs}
    for config in group.configs:
        key = config.key
        ready, done = run.ready.get(key, {}), run.done.get(key, {})
        python = _python_rates(config, group.configs, train) \
            if config.runner == "r" else {}
        twin = None if config.twin else train.get(plan.twin_key(key))
        rows.append({
            "workload": group.workload, "devices": group.devices,
            "config": key, "label": config.label, "runner": config.runner,
            "engine": config.engine or "", "cpu_merge": (
                "" if config.cpu_merge is None else config.cpu_merge),
            "is_default": config.is_default, "driver": config.driver,
            "api": ready.get("api", ""), "batch_size": group.batch_size,
            "rows_per_device": group.batch_size / (
                1 if config.runner == "plain" else group.devices),
            "train_samples_per_s": _median(train[key].values()),
            "train_best_samples_per_s": max(train[key].values(),
                                            default=float("nan")),
            "train_best_vs_plain": _best_ratio(train[key], train["plain"]),
            **_ratio_columns("train_vs_plain", train[key], train["plain"]),
            **_ratio_columns("train_vs_mirrored_by_hand", train[key],
                             train.get("mirrored_by_hand")),
            **_ratio_columns("train_vs_python", train[key], python),
            **_ratio_columns("train_vs_twin", train[key], twin),
            "train_cpu_ms_per_1k": _cpu_ms_per_1k(run, key, "epoch"),
            "predict_samples_per_s": _median(predict[key].values()),
            "predict_vs_plain": _paired_ratio(predict[key], predict["plain"]),
            "peak_rss_mib": done.get("peak_rss_mib", float("nan")),
            "peak_device_mib": done.get("peak_device_mib"),
            "rounds": len(train[key]),
            "devices_used": " ".join(ready.get("devices_used", [])),
            # What engine="auto" (or any engine) ran, as the model says.
            "engine_used": ready.get("engine_used") or "",
            "memory_locked": ready.get("memory_locked", ""),
            "status": _status(run, key),
        })
    return rows


def _status(run, key):
    if key in run.done:
        return "ok"
    if key in run.skipped:
        return f"skipped: {run.skipped[key]}"
    return f"failed: {run.failures.get(key, 'unknown')}".splitlines()[0]


def raw_rows(run):
    """One row per timed epoch or `predict` call."""
    rows = []
    for key, phase, index, seconds, cpu_seconds, faults in run.samples:
        samples = run.ready[key]["num_samples"]
        rows.append({
            "workload": run.group.workload, "devices": run.group.devices,
            "config": key, "phase": "train" if phase == "epoch" else phase,
            "round": index, "seconds": round(seconds, 6),
            "cpu_seconds": None if cpu_seconds is None
            else round(cpu_seconds, 6),
            "samples_per_s": round(samples / seconds, 2),
            "major_faults": faults,
        })
    return rows


def _format(value, digits=2):
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.{digits}f}"
    return "" if value is None else value


def write_csv(path, rows, columns, metadata=None):
    with open(path, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=columns + (
            METADATA_COLUMNS if metadata else []))
        writer.writeheader()
        for row in rows:
            row = {k: _format(v, 4) for k, v in row.items()}
            writer.writerow({**row, **(metadata or {})})






def verdict(low, high, minimum=None, maximum=None):
    """Whether a ratio's confidence interval meets a target.

    Args:
        low, high: The interval (NaN: too few rounds to have one).
        minimum, maximum: The target's bounds (None: unbounded).

    Returns:
        `"met"` when the whole interval is inside the bounds, `"not met"`
        when all of it is outside, else `"unresolved"`: this run cannot
        tell the difference from noise.
    """
    if math.isnan(low) or math.isnan(high):
        return "unresolved"
    minimum = -math.inf if minimum is None else minimum
    maximum = math.inf if maximum is None else maximum
    if minimum <= low and high <= maximum:
        return "met"
    if high < minimum or low > maximum:
        return "not met"
    return "unresolved"


def _measured(row, name, twin_row):
    """`0.963x (95% CI 0.93-0.99; identical processes 1.02x)`."""
    text = f"{row[name]:.3f}x"
    low, high = row[f"{name}_low"], row[f"{name}_high"]
    details = []
    if not math.isnan(low):
        details.append(f"{CONFIDENCE:.0%} CI {low:.2f}-{high:.2f}")
    if twin_row is not None and not math.isnan(twin_row["train_vs_twin"]):
        details.append(f"identical processes {twin_row['train_vs_twin']:.2f}x")
    return text + (f" ({'; '.join(details)})" if details else "")


def check_targets(rows):
    """The issue's acceptance targets, evaluated on this run's rows.

    Each is judged on the confidence interval of its ratio (see `verdict`);
    the measured text also gives the spread between the default engine's
    two identical processes in the same group, the run's noise floor.

    Returns:
        A list of `(statement, measured, verdict)` tuples.
    """
    checks = []
    index = {(r["workload"], r["devices"], r["config"]): r for r in rows}
    defaults = {(r["workload"], r["devices"]): r for r in rows
                if r["is_default"]}
    for (workload, devices), row in defaults.items():
        where = f"{workload}, {devices} devices"
        if devices == TARGET_ALL_WORKLOADS_DEVICES:
            checks.append((
                f"default engine >= {TARGET_ALL_WORKLOADS_VS_PLAIN}x plain "
                f"Keras ({where})",
                _measured(row, "train_vs_plain", row),
                verdict(row["train_vs_plain_low"], row["train_vs_plain_high"],
                        minimum=TARGET_ALL_WORKLOADS_VS_PLAIN)))
        if workload not in TARGET_WORKLOADS or devices not in TARGET_DEVICES:
            continue
        checks.append((
            f"default engine >= {TARGET_VS_PLAIN}x plain Keras ({where})",
            _measured(row, "train_vs_plain", row),
            verdict(row["train_vs_plain_low"], row["train_vs_plain_high"],
                    minimum=TARGET_VS_PLAIN)))
        if (workload, devices, "mirrored_by_hand") in index:
            checks.append((
                f"default engine >= MirroredStrategy by hand ({where})",
                _measured(row, "train_vs_mirrored_by_hand", None),
                verdict(row["train_vs_mirrored_by_hand_low"],
                        row["train_vs_mirrored_by_hand_high"], minimum=1.0)))
    for row in rows:
        if row["runner"] == "r" and not math.isnan(row["train_vs_python"]):
            checks.append((
                f"R within {TARGET_R_TOLERANCE:.0%} of Python "
                f"({row['workload']}, {row['devices']} device(s))",
                _measured(row, "train_vs_python", defaults.get(
                    (row["workload"], row["devices"]))),
                verdict(row["train_vs_python_low"],
                        row["train_vs_python_high"],
                        minimum=1 - TARGET_R_TOLERANCE,
                        maximum=1 + TARGET_R_TOLERANCE)))
    return checks


def _description(workload):
    from bench import models

    spec = models.WORKLOADS.get(workload)
    return spec.description if spec else ""


def _with_interval(row, name):
    """`0.96 [0.93, 0.99]`, or the ratio alone without an interval."""
    text = _format(row[name])
    low, high = row.get(f"{name}_low"), row.get(f"{name}_high")
    if text and low is not None and not math.isnan(low):
        text += f" [{low:.2f}, {high:.2f}]"
    return text


def markdown_table(rows):
    """The results as Markdown, one table per workload."""
    lines = []
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    for workload in workloads:
        lines += [f"#### {workload}", "",
                  f"{_description(workload)}", "",
                  "| devices | configuration | train samples/s | x plain "
                  "| best x plain | x MS by hand | predict samples/s "
                  "| x plain | peak RSS MiB | status |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            if r["workload"] != workload:
                continue
            label = r["label"] + (f" [{r['api']}]" if r["driver"] == "R"
                                  else "")
            if r["is_default"]:
                label = f"**{label}**"
            status = r["status"] if r["status"] == "ok" else \
                r["status"][:80].replace("|", "/")
            lines.append(
                f"| {r['devices']} | {label} "
                f"| {_format(r['train_samples_per_s'], 0)} "
                f"| {_with_interval(r, 'train_vs_plain')} "
                f"| {_format(r['train_best_vs_plain'])} "
                f"| {_format(r['train_vs_mirrored_by_hand'])} "
                f"| {_format(r['predict_samples_per_s'], 0)} "
                f"| {_format(r['predict_vs_plain'])} "
                f"| {_format(r['peak_rss_mib'], 0)} | {status} |")
        lines.append("")
    return "\n".join(lines)


def markdown_results(rows, metadata, notes, plots, image_prefix=""):
    """Environment, targets, tables and plots, as Markdown (### headings).

    Args:
        rows: Aggregated rows.
        metadata: Run metadata.
        notes: Extra lines for the environment list.
        plots: `(title, file name)` of the PNG files.
        image_prefix: Path from the Markdown file to the PNG files.
    """
    lines = [f"Run started {metadata['run_started']} ({metadata['mode']} "
             f"mode): `{metadata['command']}`.", "",
             "### Environment", ""]
    for key in ("device_type", "devices", "cpu_model", "cpu_cores",
                "gpu_names", "tensorflow", "keras", "python", "multigpu",
                "git_commit", "r", "load_before", "load_after",
                "cpu_availability_before", "cpu_availability_after"):
        if metadata.get(key) not in (None, ""):
            lines.append(f"- {key.replace('_', ' ')}: {metadata[key]}")
    lines += [f"- {note}" for note in notes]
    lines += ["", "Throughput is the median over rounds; ratios (x plain, "
              "x MS by hand) are medians of per-round ratios to the "
              "configuration measured in the same round, seconds apart, "
              f"with a {CONFIDENCE:.0%} bootstrap interval over the rounds "
              "in brackets. best x plain compares the fastest (least "
              "disturbed) epochs. The default engine runs in two identical "
              "processes (the second process row): how far they differ is "
              "the noise floor of the run, which no interval over rounds "
              "shows. A target is met when its whole interval is inside the "
              "bound, not met when all of it is outside, and unresolved "
              "otherwise.",
              "", "### Targets", "", "| target | measured | met |",
              "|---|---:|---|"]
    for statement, measured, outcome in check_targets(rows):
        shown = {"met": "yes", "not met": "**no**"}.get(outcome, outcome)
        lines.append(f"| {statement} | {measured} | {shown} |")
    lines += ["", "### Results", "", markdown_table(rows), "### Plots", ""]
    lines += [f"![{title}]({image_prefix}{name})" for title, name in plots]
    return "\n".join(lines) + "\n"


def markdown_report(rows, metadata, notes, plots):
    """The stand-alone `results.md` of a run."""
    return "# multigpu benchmark results\n\n" + markdown_results(
        rows, metadata, notes, plots)


def update_document(path, results):
    """Replaces the results section of a Markdown document.

    The section is the text between the `<!-- results:start -->` and
    `<!-- results:end -->` lines; the document is left alone without them.

    Returns:
        Whether the document was updated.
    """
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    try:
        text = path.read_text()
    except OSError:
        return False
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{results}{end}{tail}")
    return True


def plot(rows, path, phase, metadata):
    """Throughput against device count, one column per workload.

    The top row is samples/s (the dashed line: plain Keras on one device);
    the bottom row the same as a ratio to plain Keras measured in the same
    rounds, which load elsewhere on the machine affects least.

    Args:
        rows: Aggregated rows.
        path: PNG file to write.
        phase: `"train"` or `"predict"`.
        metadata: Run metadata (device type: GPU plots get an ideal line).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    gpu = metadata.get("device_type") == "GPU"
    figure, axes = plt.subplots(2, len(workloads), squeeze=False,
                                sharex="col",
                                figsize=(5.2 * len(workloads), 8.0))
    for column, workload in enumerate(workloads):
        mine = [r for r in rows if r["workload"] == workload]
        _plot_panel(axes[0][column], mine, f"{phase}_samples_per_s", gpu,
                    ratio=False)
        _plot_panel(axes[1][column], mine, f"{phase}_vs_plain", gpu,
                    ratio=True)
        axes[0][column].set_title(workload)
        axes[0][column].set_xlabel("")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center",
                  ncol=min(3, len(labels)), fontsize="small", frameon=False)
    figure.suptitle(
        f"{'Training' if phase == 'train' else 'Inference'} throughput: "
        f"{metadata.get('device_type')} devices, {metadata.get('cpu_cores')} "
        f"cores, TensorFlow {metadata.get('tensorflow')}")
    rows_of_legend = -(-len(labels) // 3)
    figure.tight_layout(rect=(0, 0.025 + 0.03 * rows_of_legend, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _plot_panel(axis, rows, column, gpu, ratio):
    counts = sorted({r["devices"] for r in rows})
    reference = 1.0 if ratio else _median(
        [r[column] for r in rows if r["runner"] == "plain"])
    axis.axhline(reference, color="black", linestyle="--", linewidth=1.2,
                 label="plain Keras, 1 device")
    if gpu and len(counts) > 1:
        axis.plot(counts, [reference * n for n in counts], color="grey",
                  linestyle=":", label="ideal: N x one device")
    labels = list(dict.fromkeys(r["label"] for r in rows
                                if r["runner"] != "plain"))
    for label in labels:
        points = sorted((r["devices"], r[column]) for r in rows
                        if r["label"] == label and not math.isnan(r[column]))
        if points:
            axis.plot(*zip(*points), marker="o", label=label,
                      linewidth=2.4 if "(default)" in label else 1.2)
    axis.set_xscale("log", base=2)
    axis.set_xticks(counts, [str(n) for n in counts])
    axis.set_xlabel("devices")
    axis.set_ylabel("x plain Keras (same rounds)" if ratio else "samples/s")
    top = max([v for v in (r[column] for r in rows) if not math.isnan(v)]
              + [reference])
    axis.set_ylim(0, top * 1.12)
    axis.grid(alpha=0.3)
