"""plot_placement: a placement report drawn as one bar group per device."""

import sys

import keras
import matplotlib
import pytest

import multigpu
from conftest import DEVICES
from multigpu.insight.plotting import placement_bars
from multigpu.placement import format_bytes
from support.models import data

matplotlib.use("Agg")


def partitioned_report(rng):
    model = keras.Sequential([keras.Input((8,))] + [
        keras.layers.Dense(16, activation="relu", name=f"d{i}") for i in range(3)])
    partitioned = multigpu.model_parallel(model, devices=2)
    partitioned.compile(optimizer="sgd", loss="mse")
    x, y = data(rng, 16, outputs=16)
    return multigpu.placement_report(partitioned, x, y, print_table=False)


def test_one_bar_group_per_device_with_the_reports_numbers(rng):
    report = partitioned_report(rng)
    ax = multigpu.plot_placement(report)
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        d.replace("/device:", "") for d in DEVICES]
    containers = ax.containers
    assert [c.get_label() for c in containers] == ["weights", "ops", "time", "transfers"]
    columns = {
        "weights": [r["variable_bytes"] for r in report],
        "ops": [r["ops"] for r in report],
        "time": [r["time_share"] for r in report],
        "transfers": [r["sent_bytes"] + r["received_bytes"] for r in report],
    }
    for container in containers:
        values = columns[container.get_label()]
        heights = [bar.get_height() for bar in container]
        assert len(heights) == len(DEVICES)  # one bar per device in each metric
        assert heights == pytest.approx([v / sum(values) for v in values])
        # Bar i of every metric sits over device i's tick.
        centres = [bar.get_x() + bar.get_width() / 2 for bar in container]
        assert [round(c) for c in centres] == list(range(len(DEVICES)))
    # Two stages: the two idle devices have empty bars, the busy ones the rest.
    assert all(containers[1][i].get_height() == 0 for i in (2, 3))
    labels = [text.get_text() for text in ax.texts]
    assert format_bytes(report[0]["variable_bytes"]) in labels
    assert str(report[0]["ops"]) in labels


def test_without_a_batch_only_weights_are_drawn():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    report = multigpu.placement_report(model, print_table=False)
    bars = placement_bars(report)
    assert [m["name"] for m in bars["metrics"]] == ["weights"]
    weights = bars["metrics"][0]
    assert weights["values"] == [r["variable_bytes"] for r in report]
    assert weights["labels"][0] == format_bytes(4 * (4 * 3 + 3))
    ax = multigpu.plot_placement(report)
    assert [c.get_label() for c in ax.containers] == ["weights"]


def test_draws_on_a_given_axes(rng):
    import matplotlib.pyplot as plt

    _, ax = plt.subplots()
    assert multigpu.plot_placement(partitioned_report(rng), ax=ax) is ax


def test_bad_reports_are_named():
    with pytest.raises(TypeError, match="Invalid `report`: received an object of type str"):
        placement_bars("report")
    with pytest.raises(TypeError, match="rows must be dicts with a `device` key"):
        placement_bars([{"ops": 1}])
    with pytest.raises(ValueError, match="without devices"):
        placement_bars([])


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    report = [{"device": "/device:CPU:0", "variable_bytes": 4, "ops": None,
               "time_share": None, "sent_bytes": None, "received_bytes": None}]
    with pytest.raises(ModuleNotFoundError, match=r"multigpu\[plot\]"):
        multigpu.plot_placement(report)
