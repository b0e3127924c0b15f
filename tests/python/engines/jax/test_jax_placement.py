"""placement_report on the JAX backend: read from the step XLA compiled.

The report compiles the step and reads the program XLA made of it. These
tests prove the split from that program: each device's slice of the rows,
the all-reduce, the devices outside the step idle; and a step XLA leaves on
one device shows no split, so the split numbers cannot come from a silent
single-device run. They need a pytest process started with
`KERAS_BACKEND=jax` (see test_jax_engine.py).
"""

import keras
import numpy as np
import pytest

import multigpu
from multigpu.placement import hlo, traffic

DEVICES = [f"/device:CPU:{i}" for i in range(4)]


def mlp():
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    hidden = keras.layers.BatchNormalization(name="norm")(hidden)
    outputs = keras.layers.Dense(3, name="scores")(hidden)
    model = keras.Model(inputs, outputs, name="mlp")
    return model


def batch(rows):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((rows, 6)).astype("float32"),
            rng.standard_normal((rows, 3)).astype("float32"))


def compiled(model):
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    return model


def column(report, key):
    return {row["device"]: row[key] for row in report}


def weights_of(model):
    """(count, bytes) of one copy of the model's variables."""
    variables = model.trainable_variables + model.non_trainable_variables
    return len(variables), sum(int(np.prod(v.shape)) * 4 for v in variables)


@pytest.fixture(scope="module")
def parallel():
    keras.utils.set_random_seed(1)
    return compiled(multigpu.multi_gpu_model(mlp(), gpus=4))


def test_the_compiled_training_step_splits_rows_and_all_reduces(parallel):
    x, y = batch(16)
    report = multigpu.placement_report(parallel, x, y, print_table=False)
    assert [row["device"] for row in report] == DEVICES
    assert column(report, "rows") == dict.fromkeys(DEVICES, 4)
    assert column(report, "slice_rows") == dict.fromkeys(DEVICES, 4)
    assert report.batch_rows == 16
    # The same program on each device, its variables whole on each.
    count, nbytes = weights_of(parallel)
    assert column(report, "variables") == dict.fromkeys(DEVICES, count)
    assert column(report, "variable_bytes") == dict.fromkeys(DEVICES, nbytes)
    assert len(set(column(report, "ops").values())) == 1
    assert report[0]["ops"] > 10
    # The gradients (and loss, metric and moment sums) are all-reduced.
    reduced = [c for c in report.collectives if c["op"] == "all-reduce"]
    assert reduced and all(c["devices"] == 4 for c in reduced)
    assert sum(c["bytes"] for c in reduced) >= report.gradient_bytes
    ring = sum(traffic.ring_allreduce_bytes(c["bytes"], 4)
               for c in report.collectives)
    assert column(report, "sent_bytes") == dict.fromkeys(DEVICES, ring)
    assert column(report, "collectives") == dict.fromkeys(
        DEVICES, len(report.collectives))
    assert {(p["source"], p["destination"]) for p in report.transfer_rows()} == {
        (DEVICES[i], DEVICES[(i + 1) % 4]) for i in range(4)}
    assert report[0]["time_share"] is None
    assert "split by XLA, a slice of 4 per device" in report.table()


def test_an_uneven_last_batch_is_split_three_three_three_one(parallel):
    # 42 rows in batches of 16: the last batch has 10 rows.
    x, y = batch(42)
    report = multigpu.placement_report(parallel, x[32:], y[32:], print_table=False)
    assert [row["rows"] for row in report] == [3, 3, 3, 1]
    assert [row["slice_rows"] for row in report] == [3] * 4
    assert any(c["op"] == "all-reduce" for c in report.collectives)
    assert "2 row(s) of padding excluded" in report.table()
    # A prediction step: the same split, the outputs gathered.
    predicted = multigpu.placement_report(parallel, x[32:], print_table=False)
    assert [row["rows"] for row in predicted] == [3, 3, 3, 1]
    assert "predict_step" in predicted.notes[0]


def test_a_step_on_two_devices_leaves_the_others_idle():
    keras.utils.set_random_seed(2)
    parallel = compiled(multigpu.multi_gpu_model(mlp(), gpus=["/cpu:1", "/cpu:3"]))
    x, y = batch(6)
    report = multigpu.placement_report(parallel, x, y, print_table=False)
    assert column(report, "rows") == {
        DEVICES[0]: 0, DEVICES[1]: 3, DEVICES[2]: 0, DEVICES[3]: 3}
    ops = column(report, "ops")
    assert ops[DEVICES[0]] == ops[DEVICES[2]] == 0 < ops[DEVICES[1]]
    assert column(report, "variables")[DEVICES[0]] == 0
    assert {(p["source"], p["destination"]) for p in report.transfer_rows()} == {
        (DEVICES[1], DEVICES[3]), (DEVICES[3], DEVICES[1])}
    assert "idle: /device:CPU:0, /device:CPU:2" in report.notes[-1]


def test_an_unsplit_single_device_step_shows_no_split():
    # A plain model: Keras's own jitted step, its variables on one device.
    keras.utils.set_random_seed(3)
    model = compiled(mlp())
    x, y = batch(16)
    report = multigpu.placement_report(model, x, y, print_table=False)
    assert column(report, "rows") == {DEVICES[0]: 16, DEVICES[1]: 0,
                                      DEVICES[2]: 0, DEVICES[3]: 0}
    assert [row["ops"] > 0 for row in report] == [True, False, False, False]
    count, nbytes = weights_of(model)
    assert report[0]["variables"] == count and report[0]["variable_bytes"] == nbytes
    assert report.collectives == [] and report.transfers == []
    assert column(report, "sent_bytes") == dict.fromkeys(DEVICES, 0)
    assert "the batch is not split" in report.table()


def test_weights_only_and_the_arguments(parallel):
    report = multigpu.placement_report(parallel, print_table=False)
    assert column(report, "variables") == dict.fromkeys(
        DEVICES, weights_of(parallel)[0])
    assert report[0]["ops"] is None and report[0]["rows"] is None
    x, y = batch(4)
    with pytest.raises(ValueError, match="is not compiled"):
        multigpu.placement_report(mlp(), x, y)


def test_row_slices_of_a_padded_program():
    text = """HloModule m, num_partitions=4

%fused (p0: f32[10,6], p1: u32[]) -> f32[3,6] {
  %p0 = f32[10,6]{1,0} parameter(0)
  %p1 = u32[] parameter(1)
  %z = f32[] constant(0)
  %pad = f32[12,6]{1,0} pad(%p0, %z), padding=0_2x0_0
  %c = s32[] convert(%p1)
  %k = s32[] constant(3)
  %m = s32[] multiply(%c, %k)
  %zero = s32[] constant(0)
  ROOT %s = f32[3,6]{1,0} dynamic-slice(%pad, %m, %zero), dynamic_slice_sizes={3,6}
}

ENTRY %main (x: f32[10,6]) -> f32[3,6] {
  %x = f32[10,6]{1,0} parameter(0), sharding={replicated}
  %id = u32[] partition-id()
  %f = f32[3,6]{1,0} fusion(%x, %id), kind=kLoop, calls=%fused
  ROOT %r = (f32[3,6]{1,0}, f32[]) all-reduce(%f, /*index=1*/%f), replica_groups={{0,1,2,3}}, to_apply=%fused
}
"""
    module = hlo.Module(text)
    assert module.num_partitions == 4
    found = module.row_slices()
    assert found == {0: hlo.Slice(0, 3, 12, 0)}
    assert [hlo.rows_of_slice(10, found[0], i) for i in range(4)] == [3, 3, 3, 1]
    assert module.collectives() == [hlo.Collective("r", "all-reduce", 144, None)]
    assert module.op_count() == 2
    assert hlo.shape_bytes("(f32[], bf16[2,3]{1,0})") == 16
