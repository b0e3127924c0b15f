"""The paired A/B runner of the cost studies (`python -m bench.<study>`).

A cost study asks what one thing costs per training step: a guard, a
wrapper, a setting. Two separate runs on a shared machine measure its load
as much as that thing, so the runner times A and B side by side:

* one process per device count (`--devices`; logical devices are fixed
  when TensorFlow starts), which runs every case of the study: every
  combination of its axes (`--workloads`, `--engines`, ...);
* per case, A is built twice (A and its null twin) and B once, with any
  steps the study times beside them; after a warm-up, `--rounds` rounds
  take one step of each, the order shuffled every round;
* per case, the median step of each in milliseconds, the ratio A / B per
  round (its median and 95% bootstrap interval, `report.median_interval`)
  and the null: the same ratio between A's twin and A, two builds of the
  same thing, which shows how far from 1.0 this run puts "no difference";
* `results.json` (the rows, the machine's load before and after) and
  `results.md`, tables of the columns the study declares.

A study declares only what differs: its A and B (`Arms`, built per case by
`Study.arms`), its axes and options with their defaults, its columns, and
any environment its workers need (`KERAS_BACKEND`, say).

Example:
    STUDY = paired.Study(
        name="sync_batchnorm_cost", a="pooled", b="per_replica",
        arms=_arms, rounds=60,
        axes=(paired.Axis("--workloads", "workload", ("bn_mlp", "bn_cnn")),),
        tables=((paired.text("workload"),
                 paired.interval("pooled / per-replica", "ratio")),))

    if __name__ == "__main__":
        sys.exit(paired.main(STUDY))
"""

import argparse
import dataclasses
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from bench import report

# Steps of each arm before the timed rounds (tracing, caches).
WARMUP = 5


@dataclasses.dataclass(frozen=True)
class Axis:
    """A comma-separated option whose values the study's cases run over.

    Attributes:
        flag: The option, e.g. `"--workloads"`.
        key: The row's column for one value, e.g. `"workload"`.
        default: The values when the option is not given.
        choices: The values allowed (empty: any).
        type: Converts one value from the command line.
    """

    flag: str
    key: str
    default: tuple
    choices: tuple = ()
    type: Callable = str


@dataclasses.dataclass(frozen=True)
class Arms:
    """What one case times.

    Each builder takes no argument and returns a step: a function that takes
    one step and returns once it is done.

    Attributes:
        a: Builds A; called twice, for A and for its null twin.
        b: Builds B.
        beside: `{name: builder}` of further steps timed in the same rounds,
            reported as `<name>_ms` (e.g. a reference).
        cells: Cells of the row known before the timing (e.g. the batch).
        after: None, or a function of the seconds per round of every step
            (`{"a", "twin", "b", *beside}: [seconds]`) returning more cells.
    """

    a: Callable
    b: Callable
    beside: dict = dataclasses.field(default_factory=dict)
    cells: dict = dataclasses.field(default_factory=dict)
    after: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a results table.

    Attributes:
        title: Its header.
        cell: A format string over the row, e.g. `"{on_ms:.2f}"`.
        align: Its Markdown alignment row cell (`"---:"` right, `"---"` left).
    """

    title: str
    cell: str
    align: str = "---:"


def text(key):
    """A left-aligned column of the row's `key` as it is, titled `key`."""
    return Column(key, f"{{{key}}}", "---")


def number(title, cell):
    """A right-aligned column, e.g. `number("step (ms)", "{b_ms:.2f}")`."""
    return Column(title, cell)


def interval(title, name, digits=3):
    """A column `median [low, high]` of the cells `ratio` writes as `name`."""
    spec = f":.{digits}f"
    return Column(title, f"{{{name}{spec}}} [{{{name}_low{spec}}}, "
                         f"{{{name}_high{spec}}}]", "---")


@dataclasses.dataclass(frozen=True)
class Study:
    """What a cost study declares; `main(study)` runs it.

    Attributes:
        name: Its module in `bench`, e.g. `"guard_cost"`: the command
            `python -m bench.<name>`, which also runs its workers.
        a, b: Names of A and B: their median steps are the row's
            `<a>_ms` and `<b>_ms`.
        arms: `arms(case, devices)` returns the case's `Arms`; `case` is a
            dict of one value of each axis and of every option.
        tables: The results' tables, each a tuple of `Column`s.
        axes: The `Axis`es the cases run over (every combination).
        options: `{name: default}` of further options (`--name`), the same
            in every case; the default's type converts them.
        devices: Default device counts, a process each.
        rounds: Default timed rounds per case.
        environment: Variables set in the environment of its worker
            processes, e.g. `{"KERAS_BACKEND": "jax"}`: Keras chooses its
            backend once per process, at import.
    """

    name: str
    a: str
    b: str
    arms: Callable
    tables: tuple
    axes: tuple = ()
    options: dict = dataclasses.field(default_factory=dict)
    devices: tuple = (2, 4)
    rounds: int = 100
    environment: dict = dataclasses.field(default_factory=dict)


def pair(steps, rounds, warmup=WARMUP, seed=0, clock=time.perf_counter):
    """Times steps in turn: every round one of each, in a shuffled order.

    Args:
        steps: `{name: step}`, each step a function of no argument.
        rounds: Timed rounds.
        warmup: Untimed calls of each step first.
        seed: Seed of the order.
        clock: The clock, in seconds.

    Returns:
        `{name: [seconds per round]}`.

    Example:
    >>> seconds = pair({"a": guarded_step, "b": bare_step}, rounds=100)
    >>> ratio("ratio", seconds["a"], seconds["b"])["ratio"]
    1.01...
    """
    for step in steps.values():
        for _ in range(warmup):
            step()
    names, order = list(steps), random.Random(seed)
    seconds = {name: [] for name in names}
    for _ in range(rounds):
        order.shuffle(names)
        for name in names:
            start = clock()
            steps[name]()
            seconds[name].append(clock() - start)
    return seconds


def ratio(name, numerator, denominator):
    """The per-round ratio of two steps' seconds: its median and interval.

    Returns:
        `{name: median, name_low: low, name_high: high}` (an interval needs
        3 rounds; NaN below).

    Example:
    >>> ratio("ratio", [2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    {'ratio': 2.0, 'ratio_low': 2.0, 'ratio_high': 2.0}
    """
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    low, high = report.median_interval(ratios)
    return {name: statistics.median(ratios), f"{name}_low": low,
            f"{name}_high": high}


def milliseconds(seconds):
    """The median of seconds, in milliseconds."""
    return 1e3 * statistics.median(seconds)


def _load():
    return os.getloadavg()[0]


def measure(study, case, devices, rounds, clock=time.perf_counter):
    """One case: A, its twin and B (and any steps beside them) in turn.

    Args:
        study: The `Study`.
        case: One value of each axis (`{"workload": "demo", ...}`); options
            it leaves out take their defaults.
        devices: The devices (e.g. `multigpu.virtual_devices(n)`).
        rounds: Timed rounds.
        clock: The clock, in seconds.

    Returns:
        The row: the case, `devices`, `rounds`, the arms' cells, `<a>_ms`,
        `<b>_ms` and `<name>_ms` of the steps beside them, `ratio` (A / B)
        and `null` (A's twin / A) with their `_low` and `_high`, the
        1-minute load before and after, and the cells of `Arms.after`.
    """
    case = {**study.options, **case}
    load = _load()
    arms = study.arms(case, devices)
    builders = {"a": arms.a, "twin": arms.a, "b": arms.b, **arms.beside}
    seconds = pair({name: build() for name, build in builders.items()},
                   rounds, clock=clock)
    row = {**case, "devices": len(devices), "rounds": rounds, **arms.cells,
           f"{study.a}_ms": milliseconds(seconds["a"]),
           f"{study.b}_ms": milliseconds(seconds["b"]),
           **{f"{name}_ms": milliseconds(seconds[name])
              for name in arms.beside},
           **ratio("ratio", seconds["a"], seconds["b"]),
           **ratio("null", seconds["twin"], seconds["a"])}
    if arms.after is not None:
        row.update(arms.after(seconds))
    row.update(load_1min=load, load_1min_after=_load())
    return row


def markdown(study, rows):
    """The study's tables of `rows`, in Markdown."""
    tables = []
    for columns in study.tables:
        lines = ["| " + " | ".join(c.title for c in columns) + " |",
                 "|" + "|".join(c.align for c in columns) + "|"]
        lines += ["| " + " | ".join(c.cell.format(**row) for c in columns)
                  + " |" for row in rows]
        tables.append("\n".join(lines) + "\n")
    return "\n".join(tables)


def argument_parser(study):
    """The study's command line: the runner's options, its axes and options.

    Args:
        study: The `Study`.

    Returns:
        An `argparse.ArgumentParser`.
    """
    parser = argparse.ArgumentParser(prog=f"python -m bench.{study.name}")
    parser.add_argument("--output",
                        default=f"out/{study.name.replace('_', '-')}")
    parser.add_argument("--devices", default=",".join(map(str, study.devices)),
                        help="device counts, a process each")
    parser.add_argument("--rounds", type=int, default=study.rounds,
                        help="timed rounds of steps per case")
    for axis in study.axes:
        parser.add_argument(axis.flag, default=",".join(map(str, axis.default)),
                            help=f"comma-separated {axis.key}s")
    for name, default in study.options.items():
        parser.add_argument(f"--{name}", type=type(default), default=default)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    return parser


def cases(study, args, parser):
    """Every combination of the axes' values, each with the options.

    Args:
        study: The `Study`.
        args: What `parser` parsed.
        parser: `argument_parser(study)`, which reports unknown values.

    Returns:
        A list of cases: dicts of one value of each axis (under its key)
        and of every option, the first axis varying slowest.

    Raises:
        SystemExit: A value outside an axis's choices (`parser.error`).
    """
    values = []
    for axis in study.axes:
        flag = axis.flag[2:].replace("-", "_")
        given = [v for v in getattr(args, flag).split(",") if v]
        unknown = set(given) - set(map(str, axis.choices or given))
        if unknown:
            parser.error(f"unknown {axis.flag} {sorted(unknown)}; expected "
                         f"some of {list(axis.choices)}")
        values.append([axis.type(v) for v in given])
    options = {name: getattr(args, name) for name in study.options}
    return [{**dict(zip((a.key for a in study.axes), combination,
                        strict=True)), **options}
            for combination in itertools.product(*values)]


def _worker(study, count, every_case, rounds):
    import warnings

    import multigpu

    devices = multigpu.virtual_devices(count)
    warnings.simplefilter("ignore", UserWarning)
    rows = []
    for case in every_case:
        rows.append(measure(study, case, devices, rounds))
        # Progress on stderr; the rows go to stdout at the end.
        print(markdown(study, rows[-1:]).splitlines()[2], file=sys.stderr,
              flush=True)
    return rows


def worker_environment(study):
    """The environment of a study's worker processes.

    This process's environment, TensorFlow's info logs off, and the
    study's `environment` over them.
    """
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **study.environment}


def main(study, argv=None):
    """Runs a study: a worker process per device count, then its outputs.

    Args:
        study: The `Study`.
        argv: Its command line (default `sys.argv[1:]`).

    Returns:
        The exit status.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argument_parser(study)
    args = parser.parse_args(argv)
    every_case = cases(study, args, parser)
    if args.worker:
        print(json.dumps(_worker(study, args.worker, every_case, args.rounds)))
        return 0
    rows, load_before = [], _load()
    for count in [int(d) for d in args.devices.split(",") if d]:
        done = subprocess.run(
            [sys.executable, "-m", f"bench.{study.name}", *argv, "--worker",
             str(count)], stdout=subprocess.PIPE, text=True, check=False,
            env=worker_environment(study))
        if done.returncode:
            raise SystemExit(f"{study.name} worker on {count} devices failed")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    report.write_results(
        args.output, {"rows": rows, "load_1min_before": load_before,
                      "load_1min_after": _load()},
        markdown(study, rows))
    return 0


def train_step(model, x, y):
    """A step of `model`: one call of its `train_function` on `(x, y)`.

    The batch repeats (distributed as `fit` distributes it under a
    strategy of several replicas); the step fetches its logs, so it returns
    once the step is done. The function is the one the model holds when
    this is called.

    Args:
        model: A compiled Keras model.
        x, y: One batch.

    Returns:
        A function of no argument.
    """
    import tensorflow as tf

    model.make_train_function()
    function = model.train_function
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    strategy = model.distribute_strategy
    if strategy.num_replicas_in_sync > 1:
        dataset = strategy.experimental_distribute_dataset(dataset)
    iterator = iter(dataset)

    def step():
        for value in tf.nest.flatten(function(iterator)):
            value.numpy()

    return step
