"""ScalingMonitor: throughput, the one-device baseline, efficiency, the
warning when one device would be faster, its summary and plot."""

import warnings

import keras
import matplotlib
import numpy as np
import pytest

import multigpu
from multigpu.insight import scaling
from multigpu.step import train_function as chain
from multigpu.variables import variable_bytes
from support.models import copy_of, data, max_weight_difference, mlp

matplotlib.use("Agg")

ROWS, BATCH, EPOCHS = 96, 16, 2     # 6 steps an epoch


def compiled_parallel(template):
    parallel = multigpu.multi_gpu_model(template, gpus=2)
    parallel.compile(optimizer="adam", loss="mse")
    return parallel


def fit(model, rng, monitor, **kwargs):
    x, y = data(rng, ROWS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0,
                  shuffle=False, callbacks=[monitor] if monitor else None,
                  **kwargs)
    return [str(w.message) for w in caught if "One device would be faster" in str(w.message)]


def test_summary_of_a_fit_on_the_replicate_engine(rng):
    monitor = multigpu.ScalingMonitor(baseline_steps=3, warn=False)
    parallel = compiled_parallel(mlp())
    fit(parallel, rng, monitor)
    summary = monitor.summary()
    assert set(summary) == set(multigpu.insight.monitor.SUMMARY_KEYS)
    assert summary["devices"] == 2 and summary["engine"] == "replicate"
    assert summary["batch_size"] == BATCH
    assert summary["steps"] == EPOCHS * ROWS // BATCH - monitor.warmup_steps
    assert summary["samples_per_second"] > 0 and summary["step_seconds"] > 0
    assert summary["baseline_step_seconds"] > 0
    assert summary["speedup"] == pytest.approx(
        summary["baseline_step_seconds"] / summary["step_seconds"])
    assert summary["efficiency"] == pytest.approx(summary["speedup"] / 2)
    assert summary["baseline_samples_per_second"] == pytest.approx(
        BATCH / summary["baseline_step_seconds"])
    # Logical CPU devices pass references: no communication; input not timed.
    assert summary["communication_seconds"] == 0.0
    assert summary["compute_seconds"] == summary["step_seconds"]
    assert summary["input_wait_seconds"] is None
    assert summary["host_seconds"] >= 0
    assert any("input" in note for note in summary["notes"])
    history = monitor.history()
    assert len(history["seconds"]) == summary["steps"]
    assert history["samples_per_second"] == pytest.approx(
        [BATCH / s for s in history["seconds"]])
    assert monitor.baseline_cost_seconds > 0


def test_the_monitor_changes_nothing_in_the_training(rng):
    template = mlp()
    twin = copy_of(template)
    watched, plain = compiled_parallel(template), compiled_parallel(twin)
    fit(watched, np.random.default_rng(3), multigpu.ScalingMonitor(warn=False))
    fit(plain, np.random.default_rng(3), None)
    assert max_weight_difference(template, twin) < 1e-6
    steps = EPOCHS * ROWS // BATCH
    assert int(watched.optimizer.iterations.numpy()) == steps
    # The monitor's link is gone once fit returns.
    assert chain.links(watched) == ("guard", "watch")


def test_a_model_under_mirrored_strategy(rng):
    strategy = multigpu.mirrored_strategy(2)
    with strategy.scope():
        model = mlp()
        model.compile(optimizer="sgd", loss="mse")
    monitor = multigpu.ScalingMonitor(baseline_steps=2, warn=False)
    fit(model, rng, monitor)
    summary = monitor.summary()
    assert summary["engine"] == "strategy" and summary["devices"] == 2
    assert summary["batch_size"] == BATCH
    assert summary["efficiency"] > 0
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * ROWS // BATCH


# Full tier: the monitor's own numbers are the engine's; the other tests here run it in the gate.
@pytest.mark.full
def test_a_model_on_the_mirrored_engine(rng):
    template = mlp()
    twin = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine="mirrored")
    parallel.compile(optimizer="adam", loss="mse")
    plain = multigpu.multi_gpu_model(twin, gpus=2, engine="mirrored")
    plain.compile(optimizer="adam", loss="mse")
    monitor = multigpu.ScalingMonitor(baseline_steps=2, warn=False)
    fit(parallel, np.random.default_rng(5), monitor)
    fit(plain, np.random.default_rng(5), None)
    summary = monitor.summary()
    assert summary["engine"] == "mirrored" and summary["devices"] == 2
    assert summary["batch_size"] == BATCH
    assert summary["efficiency"] == pytest.approx(summary["speedup"] / 2)
    assert max_weight_difference(template, twin) < 1e-6


@pytest.mark.parametrize("baseline_seconds,warned", [(1e-9, True), (10.0, False)])
def test_warns_when_one_device_would_be_faster(rng, baseline_seconds, warned):
    monitor = multigpu.ScalingMonitor()

    # The baseline's time decides; pin it to a step far faster or slower
    # than any measured one.
    def pinned(batch):
        monitor._baseline_seconds = baseline_seconds

    monitor._measure_baseline = pinned
    messages = fit(compiled_parallel(mlp()), rng, monitor)
    assert len(messages) == (1 if warned else 0)
    if warned:
        assert "on 2 devices" in messages[0] and "larger batch" in messages[0]


def test_no_baseline_no_efficiency_and_no_warning(rng):
    monitor = multigpu.ScalingMonitor(baseline_steps=0)
    assert fit(compiled_parallel(mlp()), rng, monitor) == []
    summary = monitor.summary()
    assert summary["efficiency"] is None and summary["speedup"] is None
    assert summary["samples_per_second"] > 0


def test_communication_is_estimated_from_bytes_on_a_named_link(rng):
    monitor = multigpu.ScalingMonitor(baseline_steps=0, link="pcie4")
    parallel = compiled_parallel(mlp())
    fit(parallel, rng, monitor)
    gradient = sum(variable_bytes(v) for v in parallel.template.trainable_variables)
    bandwidth = scaling.LINKS["pcie4"].bandwidth
    # As if on 4 GPUs: replicate sends 3 copies from its first device, an
    # all-reduce 2 * 3 / 4.
    monitor._devices = [f"/device:GPU:{i}" for i in range(4)]
    assert monitor._communication(1.0) == pytest.approx(3 * gradient / bandwidth)
    monitor._engine = "mirrored"
    assert monitor._communication(1.0) == pytest.approx(1.5 * gradient / bandwidth)
    monitor.link = None
    assert monitor._communication(1.0) is None
    summary = monitor.summary()
    assert summary["compute_seconds"] is None
    assert any("link" in note for note in summary["notes"])


def test_plot_draws_the_steps_and_the_baseline_levels(rng):
    monitor = multigpu.ScalingMonitor(baseline_steps=2, warn=False)
    fit(compiled_parallel(mlp()), rng, monitor)
    ax = monitor.plot()
    steps, baseline, ideal = ax.get_lines()
    assert list(steps.get_xdata()) == monitor.history()["step"]
    one = monitor.summary()["baseline_samples_per_second"]
    assert baseline.get_ydata()[0] == pytest.approx(one)
    assert ideal.get_ydata()[0] == pytest.approx(2 * one)
    assert "efficiency" in ax.get_title()
    with pytest.raises(ValueError, match="measured no step"):
        multigpu.ScalingMonitor().plot()


@pytest.mark.parametrize("kwargs,message", [
    ({"baseline_steps": -1}, "Invalid `baseline_steps`: received -1"),
    ({"warmup_steps": 0}, "Invalid `warmup_steps`: received 0"),
    ({"link": "ethernet"}, "Invalid `link`: received 'ethernet'"),
    ({"warn": "yes"}, "Invalid `warn`: received 'yes'"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        multigpu.ScalingMonitor(**kwargs)


def test_summary_before_any_fit_says_what_is_missing():
    summary = multigpu.ScalingMonitor().summary()
    assert summary["samples_per_second"] is None and summary["efficiency"] is None
    assert summary["steps"] == 0
    assert isinstance(multigpu.ScalingMonitor(), keras.callbacks.Callback)
