"""Runs the groups of a benchmark: worker processes in lockstep."""

import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time

from bench.lockstep import protocol

REPO = pathlib.Path(__file__).resolve().parents[2]
R_WORKER = pathlib.Path(__file__).resolve().parent / "r_worker.R"


def worker_env(r_library=None):
    """Environment of the workers: the core and `bench` importable."""
    env = dict(os.environ)
    paths = [str(REPO), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["RETICULATE_PYTHON"] = sys.executable
    env["PYTHONUNBUFFERED"] = "1"
    if r_library:
        env["MULTIGPU_BENCH_R_LIBRARY"] = str(r_library)
    return env


def install_r_package(library_dir, log):
    """Installs the R package from this checkout into `library_dir`.

    Returns:
        `(installed, note)`: whether the package API can be used, and why
        not when it cannot.
    """
    if not (REPO / "DESCRIPTION").exists():
        return False, "no R package (DESCRIPTION) in this checkout"
    if not (REPO / "NAMESPACE").exists():
        return False, "R package not installable yet (no NAMESPACE)"
    command = ["R", "CMD", "INSTALL", "--no-docs", "--no-multiarch",
               "--no-test-load", f"--library={library_dir}", str(REPO)]
    done = subprocess.run(command, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=REPO)
    log.write_text(done.stdout)
    if done.returncode != 0:
        tail = done.stdout.strip().splitlines()[-1:] or ["?"]
        return False, f"R CMD INSTALL failed ({tail[0]}); see {log}"
    return True, ""


def run_probe(env, timeout=300):
    """Runs `bench.lockstep.probe` in a process of its own; returns its dict."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.lockstep.probe"], env=env, cwd=REPO,
        capture_output=True, text=True,
        timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_PROBE "):
            return json.loads(line[len("BENCH_PROBE "):])
    raise RuntimeError(f"bench.lockstep.probe failed:\n{done.stderr[-3000:]}")


def worker_config(group, config, seed):
    return {
        "workload": group.workload, "runner": config.runner,
        "devices": group.devices, "engine": config.engine,
        "cpu_merge": config.cpu_merge, "batch_size": group.batch_size,
        "epochs": group.warmup_epochs + group.rounds,
        "predict_calls": group.predict_warmup + group.predict_rounds,
        "seed": seed, "rows": group.rows,
    }


def worker_command(config, config_path):
    if config.runner == "r":
        return ["Rscript", "--no-save", "--no-restore", str(R_WORKER),
                str(config_path)]
    return [sys.executable, "-m", "bench.lockstep.worker", str(config_path)]


class GroupRun:
    """The state of one group's run: workers, measurements, failures.

    Args:
        group: The `plan.Group`.
        workdir: Directory for the configs and logs of the workers.
        env: The workers' environment.
        seed: Seed of the data, the models and the round order.
        timeout: Seconds to wait for any single report of a worker.
        skip: `{config key: reason}` of configurations not to start.
    """

    def __init__(self, group, workdir, env, seed, timeout, skip=None,
                 progress=None):
        self.group = group
        self.progress = progress or (lambda message: None)
        self._clock = time.monotonic()
        self.workdir = pathlib.Path(workdir)
        self.env = env
        self.seed = seed
        self.timeout = timeout
        self.handles = {}
        self.ready = {}
        self.done = {}
        self.skipped = dict(skip or {})
        self.failures = {}
        # (config key, phase, round, seconds, cpu seconds, major faults)
        self.samples = []

    def _say(self, message):
        self.progress(f"    {time.monotonic() - self._clock:6.1f} s  {message}")

    def _alive(self):
        return [k for k in self.handles if k not in self.failures]

    def _call(self, key, action, *args):
        try:
            return action(*args)
        except protocol.WorkerError as error:
            self.failures[key] = str(error)
            self.handles[key].kill(grace=10)
            return None

    def start(self):
        name = f"{self.group.workload}-{self.group.devices}"
        for config in self.group.configs:
            if config.key in self.skipped:
                continue
            path = self.workdir / f"{name}-{config.key}.json"
            path.write_text(json.dumps(
                worker_config(self.group, config, self.seed)))
            self.handles[config.key] = protocol.WorkerHandle(
                f"{name} {config.key}", worker_command(config, path),
                self.env, self.workdir / f"{name}-{config.key}.log",
                self.timeout)
        for key in list(self.handles):
            report = self._call(key, self.handles[key].expect, "ready")
            if report is not None:
                self.ready[key] = report

    def _phase(self, event, warmup, rounds, rng):
        for _ in range(warmup):
            for key in self._alive():
                self._call(key, self.handles[key].grant, event)
        for index in range(rounds):
            order = self._alive()
            rng.shuffle(order)
            for key in order:
                report = self._call(key, self.handles[key].grant, event)
                if report is not None:
                    self.samples.append((key, event, index, report["seconds"],
                                         report.get("cpu_seconds"),
                                         report.get("major_faults")))

    def run(self):
        """Starts the workers, runs every round, collects the results."""
        rng = random.Random(self.seed)
        try:
            self.start()
            self._say(f"{len(self._alive())} workers ready")
            group = self.group
            self._phase("epoch", group.warmup_epochs, group.rounds, rng)
            self._say("training rounds done")
            self._phase("predict", group.predict_warmup, group.predict_rounds,
                        rng)
            for key in self._alive():
                report = self._call(key, self.handles[key].finish)
                if report is not None:
                    self.done[key] = report
        finally:
            for handle in self.handles.values():
                handle.close()
        return self


def run_groups(groups, env, seed, timeout, skip, progress=None,
               workdir=None):
    """Runs every group in turn; returns the list of `GroupRun`s.

    Args:
        workdir: Directory kept for the workers' configs and logs; None for a
            temporary one, removed at the end.
    """
    progress = progress or (lambda message: print(message, flush=True))
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="multigpu-bench-") as tmp:
            return run_groups(groups, env, seed, timeout, skip, progress, tmp)
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    runs = []
    for number, group in enumerate(groups, 1):
        progress(f"[{number}/{len(groups)}] {group.workload} on "
                 f"{group.devices} device(s): {len(group.configs)} "
                 f"configurations, {group.rounds} rounds")
        run = GroupRun(group, workdir, env, seed, timeout, skip,
                       progress).run()
        for key, reason in run.failures.items():
            progress(f"    FAILED {key}: {reason}")
        runs.append(run)
    return runs
