"""The benchmark harness runs and writes its outputs (never how fast)."""

import csv
import functools
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
if str(REPO) not in sys.path:  # `bench` lives at the top of the checkout
    sys.path.insert(0, str(REPO))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One tiny `--quick` run: plain Keras and the default engine, 2 devices.

    `make bench-quick` runs the harness anyway (a configuration of each
    kind of worker, 2 devices) and then these tests on its outputs, named by
    MULTIGPU_BENCH_QUICK_OUTPUT; `make test-python` leaves them to it.
    """
    given = os.environ.get("MULTIGPU_BENCH_QUICK_OUTPUT")
    if given:
        return pathlib.Path(given).resolve()
    output = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "bench.lockstep", "--quick", "--workloads", "demo",
         "--devices", "2", "--configs", "plain,default", "--rounds", "1",
         "--output", str(output)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return output


@pytest.mark.bench_quick
def test_writes_csv_with_the_expected_columns(quick_run):
    from bench.lockstep import report

    with open(quick_run / "results.csv") as stream:
        reader = csv.DictReader(stream)
        rows = list(reader)
    assert reader.fieldnames == report.COLUMNS + report.METADATA_COLUMNS
    assert {r["config"] for r in rows} >= {"plain"}
    assert any(r["is_default"] == "True" for r in rows)
    # engine="auto" runs the replicate engine on logical CPU devices.
    assert {r["engine_used"] for r in rows if r["is_default"] == "True"} == {
        "replicate"}
    for row in rows:
        assert row["status"] == "ok"
        assert row["devices"] == "2"
        assert float(row["train_samples_per_s"]) > 0
        assert float(row["predict_samples_per_s"]) > 0
        assert float(row["peak_rss_mib"]) > 0
        assert row["tensorflow"] and row["cpu_cores"]


@pytest.mark.bench_quick
def test_writes_raw_measurements(quick_run):
    from bench.lockstep import report

    with open(quick_run / "raw.csv") as stream:
        reader = csv.DictReader(stream)
        rows = list(reader)
    assert reader.fieldnames == report.RAW_COLUMNS
    assert {r["phase"] for r in rows} == {"train", "predict"}


@pytest.mark.bench_quick
def test_writes_markdown_and_plots(quick_run):
    markdown = (quick_run / "results.md").read_text()
    assert "| devices | configuration | train samples/s | x plain |" in markdown
    assert "## Environment" in markdown and "## Targets" in markdown
    assert "cpu availability before: median" in markdown
    assert "second process" in markdown
    for name in ("train.png", "predict.png"):
        assert (quick_run / name).read_bytes()[:8] == PNG_MAGIC
        assert f"]({name})" in markdown


def test_median_interval_brackets_the_median_and_narrows_with_rounds():
    import random

    from bench import report

    rng = random.Random(1)
    few = [1 + rng.gauss(0, 0.05) for _ in range(10)]
    many = [1 + rng.gauss(0, 0.05) for _ in range(400)]
    low, high = report.median_interval(few)
    assert low <= sorted(few)[5] and sorted(few)[4] <= high
    many_low, many_high = report.median_interval(many)
    assert many_high - many_low < high - low
    assert report.median_interval(few) == (low, high)  # seeded
    assert all(map(lambda v: v != v, report.median_interval([1.0, 2.0])))


def test_verdict_needs_the_whole_interval_on_one_side():
    from bench.lockstep import report

    assert report.verdict(0.96, 0.99, minimum=0.95) == "met"
    assert report.verdict(0.90, 0.94, minimum=0.95) == "not met"
    assert report.verdict(0.93, 0.97, minimum=0.95) == "unresolved"
    assert report.verdict(0.98, 1.02, 0.97, 1.03) == "met"
    assert report.verdict(1.04, 1.10, 0.97, 1.03) == "not met"
    assert report.verdict(1.01, 1.05, 0.97, 1.03) == "unresolved"
    assert report.verdict(float("nan"), float("nan"), minimum=0.95) == \
        "unresolved"


def test_the_default_engine_runs_twice_and_its_twin_follows_selection():
    from bench.lockstep import plan

    probe = {"default_engine": "replicate", "variants": [
        {"engine": "replicate", "cpu_merge": True},
        {"engine": "mirrored", "cpu_merge": True}]}
    configs = plan.all_configs(probe)
    keys = [c.key for c in configs]
    assert keys.index("replicate_twin") == keys.index("replicate") + 1
    twin = configs[keys.index("replicate_twin")]
    assert not twin.is_default and twin.label.endswith("second process")
    for selection in (["default"], ["replicate"], ["multi_gpu_model"]):
        chosen = [c.key for c in plan.select_configs(configs, selection)]
        assert "replicate_twin" in chosen, selection
    chosen = [c.key for c in plan.select_configs(configs, ["mirrored", "r"])]
    assert "replicate_twin" not in chosen and "mirrored" in chosen


def test_r_is_compared_with_both_python_processes():
    from bench.lockstep import plan, report

    configs = [plan.Config("plain"),
               plan.Config("multi_gpu_model", "replicate", True, True),
               plan.Config("multi_gpu_model", "replicate", True, twin=True),
               plan.Config("r", "replicate")]
    train = {"replicate": {0: 100.0, 1: 90.0},
             "replicate_twin": {0: 81.0, 1: 40.0}}
    rates = report._python_rates(configs[3], configs, train)
    assert rates == {0: 90.0, 1: 60.0}
    del train["replicate_twin"]
    assert report._python_rates(configs[3], configs, train) == \
        train["replicate"]


def test_the_mnist_cnn_workload_puts_32_rows_on_each_of_4_replicas():
    # A workload of another shape than demo's, cnn's and mlp_large's: small
    # images and few weights, so per-replica costs decide its ratios.
    import keras

    from bench import models
    from bench.lockstep import plan

    spec = models.WORKLOADS["mnist_cnn"]
    assert spec.batch_size // 4 == 32
    x, y = models.load_data("mnist_cnn")
    assert (x.shape, x.dtype.name, y.shape) == ((2048, 28, 28, 1), "float32",
                                                (2048,))
    assert set(y.tolist()) <= set(range(models.NUM_CLASSES))
    model = models.build_model("mnist_cnn")
    assert tuple(model(x[:3]).shape) == (3, models.NUM_CLASSES)
    groups = plan.make_groups([plan.Config("plain")], ["mnist_cnn"], [1, 4])
    assert [(g.workload, g.devices, g.batch_size) for g in groups] == [
        ("mnist_cnn", 1, 128), ("mnist_cnn", 4, 128)]
    keras.utils.clear_session()


def test_every_workload_has_the_4_device_target():
    from bench.lockstep import report

    def row(workload, devices, low, high):
        return {"workload": workload, "devices": devices, "config": "auto",
                "is_default": True, "runner": "multi_gpu_model",
                "train_vs_plain": (low + high) / 2, "train_vs_plain_low": low,
                "train_vs_plain_high": high,
                "train_vs_twin": float("nan"),
                "train_vs_python": float("nan")}

    checks = report.check_targets([row("mnist_cnn", 4, 0.98, 1.05),
                                   row("mlp_large", 4, 0.90, 1.00),
                                   row("mnist_cnn", 2, 0.5, 0.6)])
    verdicts = {statement: verdict for statement, _, verdict in checks}
    assert verdicts == {
        "default engine >= 0.97x plain Keras (mnist_cnn, 4 devices)": "met",
        "default engine >= 0.97x plain Keras (mlp_large, 4 devices)":
            "unresolved",
    }


def test_the_kernel_floor_splits_the_same_gradients_over_the_devices():
    # The floor is only a floor if the split step does the whole batch's
    # work: the gradients summed over the devices equal one tape's on the
    # whole batch (the loss is a mean, so n slices sum to n times it).
    import keras
    import numpy as np

    from bench import kernel_floor, models
    from conftest import DEVICES

    x, y = models.load_data("mnist_cnn")
    x, y = x[:12], y[:12]
    model = models.build_model("mnist_cnn")
    whole = kernel_floor._step_function(model, DEVICES[:1], 12)(x, y)
    split = kernel_floor._step_function(model, DEVICES, 12)(x, y)
    for one, summed in zip(whole, split):
        np.testing.assert_allclose(len(DEVICES) * one.numpy(), summed.numpy(),
                                   rtol=1e-4, atol=1e-6)
    table = kernel_floor.markdown([{
        "workload": "mlp_large", "devices": 4, "whole_ms": 250.0,
        "split_ms": 370.0, "ratio": 0.68, "ratio_range": [0.6, 0.86]}])
    assert table.splitlines()[-1] == (
        "| mlp_large | 4 | 250.0 | 370.0 | 0.68x [0.60, 0.86] |")
    keras.utils.clear_session()


def test_the_blas_split_computes_the_whole_product_slice_by_slice():
    # The split side of bench.blas_split must do the whole product's work:
    # its row slices, stacked, are the product of all rows.
    import concurrent.futures

    import numpy as np

    from bench import blas_split

    rng = np.random.default_rng(1)
    x = rng.standard_normal((10, 6), dtype=np.float32)
    w = rng.standard_normal((6, 3), dtype=np.float32)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        parts = blas_split.split_product(x, w, 4, pool)
    assert [len(part) for part in parts] == [3, 3, 2, 2]
    np.testing.assert_allclose(np.concatenate(parts), x @ w, rtol=1e-5)
    row = blas_split.measure((8, 4, 4), 2, rounds=2, calls=2, cores=2)
    assert row["whole_ms"] > 0 and row["split_ms"] > 0
    assert row["ratio_range"][0] <= row["ratio"] <= row["ratio_range"][1]


class _Clock:
    """A clock only the fake steps advance, by their cost times the load.

    The load is the same within a round (one call of each of `arms` steps)
    and changes between rounds, as a busy machine's does.
    """

    def __init__(self, arms, noise=0.0):
        import random

        self.now, self.calls, self.arms = 0.0, 0, arms
        self.noise, self.rng = noise, random.Random(2)

    def __call__(self):
        return self.now

    def step(self, cost):
        def run():
            load = 1 + (self.calls // self.arms) % 4
            self.calls += 1
            self.now += cost * load * (1 + self.rng.gauss(0, self.noise))
        return run


def _fake_study(clock, built):
    from bench import paired

    def arms(case, devices):
        built.append((case, devices))
        return paired.Arms(
            a=lambda: clock.step(2e-3), b=lambda: clock.step(1e-3),
            beside={"ref": lambda: clock.step(4e-3)}, cells={"batch_size": 8},
            after=lambda seconds: {"rounds_seen": len(seconds["twin"])})

    return paired.Study(
        name="fake", a="slow", b="fast", arms=arms, options={"steps": 3},
        axes=(paired.Axis("--workloads", "workload", ("w1", "w2"), ("w1", "w2")),
              paired.Axis("--sizes", "size", (1, 8), type=int)),
        tables=((paired.text("workload"), paired.number("size", "{size}"),
                 paired.number("fast (ms)", "{fast_ms:.2f}"),
                 paired.interval("slow / fast", "ratio"),
                 paired.interval("the null", "null")),))


def test_the_paired_runner_finds_a_known_ratio_whatever_the_load():
    # A takes twice B's time in every round while the load quadruples from
    # one round to another: the paired ratio is exactly 2 [2, 2] and the
    # null (A's twin against A) exactly 1; no TensorFlow.
    from bench import paired

    clock, built = _Clock(arms=4), []
    study = _fake_study(clock, built)
    row = paired.measure(study, {"workload": "w1", "size": 8}, ["d0", "d1"],
                         rounds=20, clock=clock)
    assert built == [({"steps": 3, "workload": "w1", "size": 8}, ["d0", "d1"])]
    assert clock.calls == 4 * (paired.WARMUP + 20)
    exactly = functools.partial(pytest.approx, rel=1e-9)
    assert (row["ratio"], row["ratio_low"], row["ratio_high"]) == exactly((2, 2, 2))
    assert (row["null"], row["null_low"], row["null_high"]) == exactly((1, 1, 1))
    # The medians per step do see the load: 1-4 times the cost.
    assert 1.0 <= row["fast_ms"] <= 4.0
    assert (row["slow_ms"], row["ref_ms"]) == exactly((2 * row["fast_ms"], 4 * row["fast_ms"]))
    assert row["devices"] == 2 and row["rounds"] == 20
    assert row["batch_size"] == 8 and row["rounds_seen"] == 20
    assert row["load_1min"] >= 0 and row["load_1min_after"] >= 0
    table = paired.markdown(study, [row]).splitlines()
    assert table[0] == "| workload | size | fast (ms) | slow / fast | the null |"
    assert table[1] == "|---|---:|---:|---|---|"
    assert table[2].endswith("| 2.000 [2.000, 2.000] | 1.000 [1.000, 1.000] |")


def test_the_paired_runner_brackets_a_noisy_ratio_and_its_null():
    # With 2% noise per step the interval brackets the true ratio (1.5),
    # the null's brackets 1, and the steps were taken in shuffled orders.
    from bench import paired

    clock = _Clock(arms=3, noise=0.02)
    order = []

    def step(name, cost):
        run = clock.step(cost)
        return lambda: (order.append(name), run())

    seconds = paired.pair({"a": step("a", 1.5), "twin": step("twin", 1.5),
                           "b": step("b", 1.0)}, rounds=200, clock=clock)
    assert {len(v) for v in seconds.values()} == {200}
    ratio = paired.ratio("ratio", seconds["a"], seconds["b"])
    assert ratio["ratio_low"] < 1.5 < ratio["ratio_high"] < 1.52
    null = paired.ratio("null", seconds["twin"], seconds["a"])
    assert null["null_low"] < 1.0 < null["null_high"]
    rounds = {tuple(order[i:i + 3]) for i in range(3 * paired.WARMUP, len(order), 3)}
    assert len(rounds) == 6  # every order of the three


def test_the_paired_runner_runs_every_combination_of_its_axes():
    from bench import paired

    study = _fake_study(_Clock(arms=4), [])
    parser = paired.argument_parser(study)
    args = parser.parse_args(["--sizes", "2,4", "--steps", "5"])
    assert paired.cases(study, args, parser) == [
        {"workload": w, "size": s, "steps": 5}
        for w in ("w1", "w2") for s in (2, 4)]
    assert args.devices == "2,4" and args.rounds == 100
    assert args.output == "out/fake"
    args = parser.parse_args(["--workloads", "w1,w3"])
    with pytest.raises(SystemExit):
        paired.cases(study, args, parser)


def _case_row(module, case, rounds=3):
    """One case of a study on 2 devices: the smallest run with intervals."""
    import keras

    from bench import paired
    from conftest import DEVICES

    row = paired.measure(module.STUDY, case, DEVICES[:2], rounds=rounds)
    keras.utils.clear_session()
    assert row["devices"] == 2 and row["rounds"] == rounds
    assert row["ratio_low"] <= row["ratio"] <= row["ratio_high"]
    assert row["null_low"] <= row["null"] <= row["null_high"]
    first = paired.markdown(module.STUDY, [row]).splitlines()[2]
    return row, first


# Full tier: a study's plumbing; bench-quick runs the lockstep harness in the gate.
@pytest.mark.full
def test_the_sync_batchnorm_cost_pairs_the_two_settings():
    # Both settings are built from the same weights and the row reports
    # both and their ratio (never how fast they ran).
    import keras

    from bench import models, sync_batchnorm_cost

    model = models.build_model("bn_mlp")
    assert any(isinstance(layer, keras.layers.BatchNormalization)
               for layer in model.layers)
    row, line = _case_row(sync_batchnorm_cost,
                          {"workload": "bn_mlp", "engine": "replicate"})
    assert row["pooled_ms"] > 0 and row["per_replica_ms"] > 0
    assert line.startswith("| bn_mlp | replicate | 2 | ")


def test_the_guard_cost_benchmark_pairs_guarded_and_unguarded_steps():
    # The smallest workload, 2 devices; never how fast.
    from bench import guard_cost

    row, line = _case_row(guard_cost, {"workload": "demo", "engine": "replicate"})
    assert row["on_ms"] > 0 and row["off_ms"] > 0
    assert row["guard_alone_ms"] == row["guard_alone_ms"]  # not NaN
    assert line.startswith("| demo | replicate | 2 |")


def test_the_monitor_cost_benchmark_pairs_monitored_and_bare_steps():
    from bench import monitor_cost

    row, line = _case_row(monitor_cost, {"workload": "demo", "engine": "replicate"})
    assert row["monitored_ms"] > 0 and row["bare_ms"] > 0
    assert row["baseline_seconds"] > 0 and row["wrapper_alone_us"] == row["wrapper_alone_us"]
    assert line.startswith("| demo | replicate | 2 |")


# Full tier: a study's plumbing; the gate's model_parallel and replicate tests run the zero-row padding it times.
@pytest.mark.full
def test_the_zero_row_padding_benchmark_steps_its_three_variants():
    # The old cond, the padded default and the pooled path each step, and
    # the row reports both ratios; never how fast.
    from bench import zero_row_padding

    row, line = _case_row(zero_row_padding, {"workload": "demo"})
    assert all(row[f"{v}_ms"] > 0 for v in ("cond", "padded", "pooled"))
    assert (row["padded_over_pooled_low"] <= row["padded_over_pooled"]
            <= row["padded_over_pooled_high"])
    assert line.startswith("| demo | 2 |")


def test_the_jax_study_runs_its_workers_on_jax():
    # The parent process (TensorFlow here) only spawns: its workers choose
    # Keras's JAX backend through their environment.
    from bench import jax_throughput, paired

    study = jax_throughput.STUDY
    environment = paired.worker_environment(study)
    assert environment["KERAS_BACKEND"] == "jax"
    assert environment["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert study.devices == (4,)
    parser = paired.argument_parser(study)
    args = parser.parse_args(list(jax_throughput.QUICK))
    assert paired.cases(study, args, parser) == [
        {"workload": "mlp", "batch": 64, "rows": 128}]


@pytest.fixture(scope="module")
def jax_quick_run(tmp_path_factory):
    """The JAX study's `--quick` run: its output directory.

    `make bench-quick` writes it into MULTIGPU_BENCH_QUICK_OUTPUT's
    `jax-throughput`; otherwise it runs here.
    """
    given = os.environ.get("MULTIGPU_BENCH_QUICK_OUTPUT")
    if given:
        return pathlib.Path(given).resolve() / "jax-throughput"
    output = tmp_path_factory.mktemp("jax-throughput")
    done = subprocess.run(
        [sys.executable, "-m", "bench.jax_throughput", "--quick",
         "--output", str(output)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return output


@pytest.mark.bench_quick
def test_the_jax_study_pairs_the_engine_with_data_parallel(jax_quick_run):
    # Both sides trained (never how fast), and on the uneven batch the
    # anchor raised while the engine trained as one device does.
    import json

    rows = json.loads((jax_quick_run / "results.json").read_text())["rows"]
    assert [(r["workload"], r["batch_size"], r["devices"]) for r in rows] == [
        ("mlp", 64, 4)]
    row = rows[0]
    assert row["multigpu_rows_per_s"] > 0 and row["data_parallel_rows_per_s"] > 0
    for name in ("speed", "speed_null"):
        assert row[f"{name}_low"] <= row[name] <= row[f"{name}_high"]
    assert row["uneven_data_parallel"] == "IndivisibleError"
    assert row["uneven_multigpu"] == "trains"
    assert row["uneven_difference"] < 1e-5
    table = (jax_quick_run / "results.md").read_text().splitlines()
    assert table[0].startswith("| workload | batch | devices | DataParallel rows/s |")
    assert table[2].startswith("| mlp | 64 | 4 | ")


def _multigpu_names_used(path):
    """(module, name, attribute or None) for each multigpu name `path` uses."""
    import ast

    tree = ast.parse(path.read_text())
    aliases, used = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "multigpu"):
            for alias in node.names:
                aliases[alias.asname or alias.name] = (node.module, alias.name)
                used.append((node.module, alias.name, None))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases):
            used.append((*aliases[node.value.id], node.attr))
    return used


def test_every_multigpu_name_the_benchmarks_use_exists():
    # `make bench` runs in no CI step: a renamed function would surface only
    # when someone measures. Each `from multigpu... import x` and each `x.y`
    # in bench/ must resolve now.
    import importlib

    missing = []
    for path in sorted((REPO / "bench").glob("*.py")):
        for module, name, attribute in _multigpu_names_used(path):
            owner = importlib.import_module(module)
            if hasattr(owner, name):
                value = getattr(owner, name)
            else:  # a submodule not imported by its package
                try:
                    value = importlib.import_module(f"{module}.{name}")
                except ModuleNotFoundError:
                    missing.append(f"{path.name}: {module}.{name}")
                    continue
            if attribute is not None and not hasattr(value, attribute):
                missing.append(f"{path.name}: {module}.{name}.{attribute}")
    assert missing == []
