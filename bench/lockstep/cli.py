"""`python -m bench.lockstep`: measure every configuration side by side, write reports.

Examples:
    python -m bench.lockstep            # full run, results in docs/bench/
    python -m bench.lockstep --quick    # CI smoke run (< 2 min), out/bench-quick/
    python -m bench.lockstep --workloads demo --devices 2,4 --configs plain,multi_gpu_model
"""

import argparse
import datetime
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from bench import models
from bench.lockstep import plan, report, runner, stability

DOCS_OUTPUT = runner.REPO / "docs" / "bench"
DOCS_PAGE = runner.REPO / "docs" / "benchmarks.md"


def _csv_list(text):
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.lockstep", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: demo workload, 2 devices, 2 rounds")
    parser.add_argument("--output", type=pathlib.Path,
                        help="directory for the CSV, Markdown and PNG files "
                             "(default docs/bench, or out/bench-quick with "
                             "--quick)")
    parser.add_argument("--workloads", type=_csv_list,
                        help=f"comma-separated subset of "
                             f"{','.join(models.WORKLOADS)}")
    parser.add_argument("--devices", type=lambda t: [int(n) for n in
                                                     _csv_list(t)],
                        help="comma-separated device counts (default "
                             "1,2,4,8 as far as the machine has them)")
    parser.add_argument("--configs", type=_csv_list,
                        help=f"runners ({','.join(plan.RUNNER_ORDER)}), "
                             "configuration keys (replicate, "
                             "replicate_device_merge, mirrored, r_replicate, "
                             "...) or 'default' (multi_gpu_model's default "
                             "engine) to include; default all. Plain Keras "
                             "always runs: it is the reference")
    parser.add_argument("--rounds", type=int,
                        help="timed epochs per configuration (default: per "
                             "workload)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=pathlib.Path,
                        help="keep the workers' configs and logs here "
                             "(default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds to wait for any one worker report")
    args = parser.parse_args(argv)
    if args.workloads and set(args.workloads) - set(models.WORKLOADS):
        parser.error(f"unknown --workloads; expected {list(models.WORKLOADS)}")
    return args


def _git_commit():
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=runner.REPO,
            capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=runner.REPO, capture_output=True, text=True).stdout.strip()
        return commit + (" (uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _r_version():
    try:
        done = subprocess.run(
            ["Rscript", "-e", "cat(R.version.string, '; reticulate', "
             "format(packageVersion('reticulate')))"],
            capture_output=True, text=True, timeout=60)
        return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _availability():
    return stability.describe(stability.cpu_availability())


def metadata_of(probe, args, started, r_note):
    """The environment recorded with the results."""
    argv = sys.argv[1:] if args.argv is None else args.argv
    return {
        "run_started": started, "mode": "quick" if args.quick else "full",
        "command": " ".join(["python -m bench.lockstep"] + [shlex.quote(a)
                                                  for a in argv]),
        "device_type": probe["device_type"],
        "cpu_model": probe["cpu_model"], "cpu_cores": probe["cpu_cores"],
        "gpu_names": ", ".join(probe["gpu_names"]),
        "tensorflow": probe["tensorflow"], "keras": probe["keras"],
        "python": probe["python"], "multigpu": probe["multigpu"],
        "git_commit": _git_commit(), "r": r_note,
        "load_before": _load(),
        "cpu_availability_before": _availability(),
    }


def write_outputs(output, rows, raws, metadata, notes):
    output.mkdir(parents=True, exist_ok=True)
    csv_metadata = {k: metadata.get(k, "") for k in report.METADATA_COLUMNS}
    report.write_csv(output / "results.csv", rows, report.COLUMNS,
                     csv_metadata)
    report.write_csv(output / "raw.csv", raws, report.RAW_COLUMNS)
    plots = [("training throughput", "train.png"),
             ("inference throughput", "predict.png")]
    report.plot(rows, output / "train.png", "train", metadata)
    report.plot(rows, output / "predict.png", "predict", metadata)
    (output / "results.md").write_text(
        report.markdown_report(rows, metadata, notes, plots))
    if output.resolve() == DOCS_OUTPUT.resolve():
        results = report.markdown_results(rows, metadata, notes, plots,
                                          image_prefix="bench/")
        if report.update_document(DOCS_PAGE, results):
            print(f"updated the results section of {DOCS_PAGE}")


def prepare_r(configs, r_library):
    """Installs the R package for the R configurations, if there are any.

    Returns:
        `(skip, notes, installed)`: configurations to skip with the reason,
        notes for the report, and whether the R package API is used.
    """
    if not any(c.runner == "r" for c in configs):
        return {}, [], False
    if shutil.which("Rscript") is None:
        return {c.key: "Rscript not found" for c in configs
                if c.runner == "r"}, [], False
    installed, why = runner.install_r_package(
        r_library, pathlib.Path(r_library) / "install.log")
    notes = [] if installed else [
        f"R runs call the Python core through reticulate, not the R "
        f"package: {why}."]
    return {}, notes, installed


def run_benchmark(args, started):
    """Probes, plans and runs; returns `(runs, metadata, notes)`."""
    workloads = args.workloads or (["demo"] if args.quick
                                   else list(models.WORKLOADS))
    with tempfile.TemporaryDirectory(prefix="multigpu-bench-r-") as r_library:
        probe = runner.run_probe(runner.worker_env(), timeout=args.timeout)
        known = plan.all_configs(probe)
        configs = plan.select_configs(known, args.configs)
        if not configs:
            raise SystemExit(f"--configs {args.configs} selects nothing; "
                             "here: " + ", ".join(c.key for c in known))
        skip, notes, r_installed = prepare_r(configs, r_library)
        counts = plan.device_counts(
            probe, args.devices or ([2] if args.quick else None))
        groups = plan.make_groups(configs, workloads, counts,
                                  quick=args.quick, rounds=args.rounds)
        with_r = any(c.runner == "r" for c in configs)
        metadata = metadata_of(probe, args, started,
                               _r_version() if with_r else "")
        notes += [f"Not run: engine={r['engine']!r} with cpu_merge="
                  f"{r['cpu_merge']} ({r['reason']})."
                  for r in probe["rejected_variants"]]
        env = runner.worker_env(r_library if r_installed else None)
        runs = runner.run_groups(groups, env, args.seed, args.timeout, skip,
                                 workdir=args.workdir)
    metadata["load_after"] = _load()
    metadata["cpu_availability_after"] = _availability()
    metadata["devices"] = _widest_device_list(runs)
    if any(not r.get("memory_locked", True) for run in runs
           for r in run.ready.values()):
        notes.append("Some workers could not lock their memory "
                     "(bench.lockstep.memory.lock_memory): page-reclaim stalls may "
                     "show in their epochs.")
    return runs, metadata, notes


def main(argv=None):
    args = parse_args(argv)
    args.argv = argv
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    clock = time.monotonic()
    output = args.output or (runner.REPO / "out" / "bench-quick"
                             if args.quick else DOCS_OUTPUT)
    print(f"load average before: {_load()}", flush=True)
    runs, metadata, notes = run_benchmark(args, started)
    rows = [row for run in runs for row in report.aggregate(run)]
    raws = [row for run in runs for row in report.raw_rows(run)]
    notes.append(f"Wall time of the run: {time.monotonic() - clock:.0f} s.")
    write_outputs(output, rows, raws, metadata, notes)
    print(report.markdown_table(rows))
    for statement, measured, outcome in report.check_targets(rows):
        print(f"{outcome.upper():10s}  {statement}: {measured}")
    print(f"load average after: {metadata['load_after']}")
    print(f"wrote {output}/results.csv, raw.csv, results.md, train.png, "
          "predict.png")
    failed = [r for r in rows if r["status"].startswith("failed")]
    return 1 if failed else 0


def _widest_device_list(runs):
    """The device names of the group with the most devices."""
    used = [r.get("devices_used", []) for run in runs
            for r in run.ready.values()]
    return ", ".join(max(used, key=len, default=[]))
