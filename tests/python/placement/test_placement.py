"""placement_report: where weights live and where one step's work runs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from conftest import DEVICES
from multigpu.placement import executed_nodes, variables_by_device
from support.models import data, mlp

KEYS = {"device", "variables", "variable_bytes", "ops", "time_share",
        "sent_bytes", "received_bytes"}


def chain(widths=(16, 16, 16), input_dim=8, name="chain"):
    layers = [keras.Input((input_dim,))]
    layers += [keras.layers.Dense(w, activation="relu", name=f"d{i}")
               for i, w in enumerate(widths)]
    return keras.Sequential(layers, name=name)


def state(model):
    return [v.numpy() for v in model.variables + model.optimizer.variables]


def row(report, device):
    return next(r for r in report if r["device"] == device)


def test_partitioned_training_step_uses_every_device(rng, capsys):
    partitioned = multigpu.model_parallel(chain((16, 16, 16, 16)), devices=4)
    partitioned.compile(optimizer="adam", loss="mse")
    x, y = data(rng, 16, outputs=16)
    before = state(partitioned)
    report = multigpu.placement_report(partitioned, x, y)
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split()[:2] == ["device", "variables"]
    assert "4 of 4 devices ran ops" in printed
    assert [r["device"] for r in report] == DEVICES
    assert all(set(r) == KEYS for r in report)
    for stage, device in enumerate(DEVICES):
        layer = partitioned.template.get_layer(f"d{stage}")
        assert row(report, device)["variables"] == 2
        assert row(report, device)["variable_bytes"] == sum(
            w.nbytes for w in layer.get_weights())
        assert row(report, device)["ops"] > 0
    shares = [r["time_share"] for r in report]  # from the profiler's trace
    assert abs(sum(shares) - 1) < 1e-6
    assert all(s > 0 for s in shares)
    assert any(note.startswith("time share:") for note in report.notes)
    # The report leaves the model as it was.
    for a, b in zip(before, state(partitioned)):
        np.testing.assert_array_equal(a, b)


def test_report_is_repeatable(rng):
    partitioned = multigpu.model_parallel(chain(), devices=3)
    x, _ = data(rng, 8)
    first = multigpu.placement_report(partitioned, x, print_table=False)
    second = multigpu.placement_report(partitioned, x, print_table=False)
    assert [r["ops"] for r in first] == [r["ops"] for r in second]
    assert [r["ops"] > 0 for r in first] == [True, True, True, False]


def test_replicated_model_keeps_weights_on_host_and_works_everywhere(rng):
    template = mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    parallel.compile(optimizer="sgd", loss="mse")
    x, y = data(rng, 16)
    report = multigpu.placement_report(parallel, x, y, print_table=False)
    total = sum(w.nbytes for w in template.get_weights())
    assert row(report, DEVICES[0])["variable_bytes"] == total
    assert all(r["variables"] == 0 for r in report[1:])
    assert all(r["ops"] > 0 for r in report)


def test_strategy_built_model_counts_each_mirrored_copy(rng):
    strategy = tf.distribute.MirroredStrategy(DEVICES[:2])
    with strategy.scope():
        model = mlp()
        model.compile(optimizer="sgd", loss="mse")
    x, y = data(rng, 8)
    report = multigpu.placement_report(model, x, y, print_table=False)
    total = sum(w.nbytes for w in model.get_weights())
    for device in DEVICES[:2]:
        assert row(report, device)["variables"] == len(model.weights)
        assert row(report, device)["variable_bytes"] == total
        assert row(report, device)["ops"] > 0
    for device in DEVICES[2:]:
        assert row(report, device) == {
            "device": device, "variables": 0, "variable_bytes": 0, "ops": 0,
            "time_share": row(report, device)["time_share"],
            "sent_bytes": 0, "received_bytes": 0}
        assert row(report, device)["time_share"] in (None, 0.0)


def test_without_a_batch_only_weights_are_reported():
    partitioned = multigpu.model_parallel(chain(), devices=2)
    report = multigpu.placement_report(partitioned, print_table=False)
    assert [r["ops"] for r in report] == [None] * len(DEVICES)
    assert [r["variables"] for r in report] == [4, 2, 0, 0]
    assert "no batch given" in report.notes[0]
    assert report.table().splitlines()[2].split()[-4:] == ["-"] * 4
    assert report.transfers is None


def test_variables_by_device_reads_the_variables():
    with tf.device(DEVICES[2]):
        model = mlp()
    assert variables_by_device(model) == {
        DEVICES[2]: (4, sum(w.nbytes for w in model.get_weights()))}


def test_executed_nodes_sees_only_this_call(rng):
    x, _ = data(rng, 4)
    first = mlp(name="first")
    first.predict(x, verbose=0)  # instantiated outside the window
    second = mlp(name="second")
    _, nodes = executed_nodes(second.predict_on_batch, x)
    names = {n.name.split("/")[0] for n in nodes}
    assert "second_1" in names and "first_1" not in names


def test_report_errors(rng):
    x, y = data(rng, 4)
    model = mlp()
    with pytest.raises(ValueError, match=r"Invalid `y`.*not compiled"):
        multigpu.placement_report(model, x, y)
    with pytest.raises(ValueError, match=r"Invalid `x`: received None"):
        multigpu.placement_report(model, None, y)
    with pytest.raises(TypeError, match=r"Invalid `model`"):
        multigpu.placement_report("model")
    with pytest.raises(ValueError, match=r"Invalid `print_table`"):
        multigpu.placement_report(model, print_table="yes")
