"""Bytes per step crossing device boundaries, against hand-computed values.

The model is 8 -> Dense(16) -> Dense(4), float32, trained with SGD on a
batch of 12 rows: weights (and one copy of their gradients) are
(8*16 + 16 + 16*4 + 4) * 4 = 848 bytes; a row of inputs is 32 bytes, of
hidden activations 64, of outputs (and targets) 16.
"""

import keras
import numpy as np
import pytest

import multigpu
from conftest import DEVICES
from multigpu.placement import traffic

ROWS = 12
WEIGHTS = (8 * 16 + 16 + 16 * 4 + 4) * 4
INPUT_ROW, HIDDEN_ROW, OUTPUT_ROW = 8 * 4, 16 * 4, 4 * 4


def dense(name="dense_net"):
    return keras.Sequential([keras.Input((8,)),
                             keras.layers.Dense(16, name="d0"),
                             keras.layers.Dense(4, name="d1")], name=name)


def batch():
    rng = np.random.default_rng(3)
    return (rng.standard_normal((ROWS, 8)).astype("float32"),
            rng.standard_normal((ROWS, 4)).astype("float32"))


def report_of(model):
    model.compile(optimizer="sgd", loss="mse")
    x, y = batch()
    return multigpu.placement_report(model, x, y, print_table=False)


def by_pair(report):
    return {(r["source"], r["destination"]): r for r in report.transfer_rows()}


def kinds(row, *names):
    return {k: row[k] for k in names}


@pytest.mark.parametrize("n", [2, 4])
def test_replicate_sends_weights_out_and_gradients_back(n):
    report = report_of(multigpu.multi_gpu_model(dense(), gpus=DEVICES[:n]))
    rows = ROWS // n
    pairs = by_pair(report)
    host = DEVICES[0]
    assert set(pairs) == ({(host, d) for d in DEVICES[1:n]}
                          | {(d, host) for d in DEVICES[1:n]})
    for device in DEVICES[1:n]:
        out = kinds(pairs[(host, device)], *traffic.KINDS)
        back = kinds(pairs[(device, host)], *traffic.KINDS)
        # Weights read by the replica; its input slice; the gradient of the
        # loss with respect to its outputs.
        assert out == {"weights": WEIGHTS, "activations": rows * INPUT_ROW,
                       "activation gradients": rows * OUTPUT_ROW,
                       "gradients": 0, "all-reduce": 0}
        # Its outputs, and its weight gradients (summed on the host).
        assert back == {"weights": 0, "activations": rows * OUTPUT_ROW,
                        "activation gradients": 0, "gradients": WEIGHTS,
                        "all-reduce": 0}
    host_row = report[0]
    assert host_row["sent_bytes"] == (n - 1) * (
        WEIGHTS + rows * (INPUT_ROW + OUTPUT_ROW))
    assert host_row["received_bytes"] == (n - 1) * (WEIGHTS + rows * OUTPUT_ROW)
    assert report.gradient_bytes == WEIGHTS and report.replicas == n
    assert report.ring_bound_bytes == 2 * (n - 1) / n * WEIGHTS
    assert "ring all-reduce bound" in report.table()


# The ring of 4 devices (12 s of tracing) is the full tier's.
@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.full)])
def test_mirrored_all_reduces_the_gradients_in_a_ring(n):
    report = report_of(multigpu.multi_gpu_model(
        dense(), gpus=DEVICES[:n], engine="mirrored"))
    pairs = by_pair(report)
    ring = DEVICES[:n]
    for i, device in enumerate(ring):
        after = ring[(i + 1) % n]
        # The gradients (848 bytes, packed into one collective) and the
        # float32 row count that keeps uneven batches exact, each reduced
        # by the ring algorithm: 2 (n-1)/n of the buffer to the next device.
        assert pairs[(device, after)]["all-reduce"] == pytest.approx(
            2 * (n - 1) / n * (WEIGHTS + 4))
    assert sum(r["weights"] + r["gradients"] for r in pairs.values()) == 0
    for device in ring[1:]:
        # The engine's train_on_batch splits the batch through fit's
        # distributed input, which places each replica's rows on its device
        # before the step: only a few scalars of step state cross in it.
        received = pairs[(DEVICES[0], device)]["activations"]
        assert received <= 32
    assert "placed on its device before the step" in report.table()


def test_model_parallel_moves_activations_between_stages():
    report = report_of(multigpu.model_parallel(dense(), devices=2))
    pairs = by_pair(report)
    forward = pairs[(DEVICES[0], DEVICES[1])]
    backward = pairs[(DEVICES[1], DEVICES[0])]
    # Hidden activations forward to stage 1 and their gradient back (the NaN
    # guard's verdict reaches stage 1 as a control edge, no data).
    assert forward["activations"] == ROWS * HIDDEN_ROW
    assert backward["activation gradients"] == ROWS * HIDDEN_ROW
    # The outputs back to the host, the loss gradient out to stage 1.
    assert backward["activations"] == ROWS * OUTPUT_ROW
    assert forward["activation gradients"] == ROWS * OUTPUT_ROW
    assert forward["weights"] == backward["weights"] == 0
    assert forward["all-reduce"] == backward["all-reduce"] == 0


def test_micro_batches_move_each_micro_batch_across():
    report = report_of(multigpu.model_parallel(dense(), devices=2,
                                               microbatches=4))
    pairs = by_pair(report)
    forward = pairs[(DEVICES[0], DEVICES[1])]
    backward = pairs[(DEVICES[1], DEVICES[0])]
    # At least every micro-batch's hidden activations go forward, and
    # their gradients come back.
    assert forward["activations"] >= ROWS * HIDDEN_ROW
    assert backward["activation gradients"] >= ROWS * HIDDEN_ROW


# Full tier: the gate's all-reduce ring test measures the same counters.
@pytest.mark.full
def test_strategy_built_model_all_reduces_and_plain_model_moves_nothing():
    strategy = multigpu.mirrored_strategy(DEVICES[:2])
    with strategy.scope():
        mirrored = dense("in_strategy")
        report = report_of(mirrored)
    pairs = by_pair(report)
    assert pairs[(DEVICES[0], DEVICES[1])]["all-reduce"] == WEIGHTS
    assert pairs[(DEVICES[1], DEVICES[0])]["all-reduce"] == WEIGHTS
    plain = report_of(dense("plain"))
    assert plain.transfer_rows() == []
    assert all(r["sent_bytes"] == r["received_bytes"] == 0 for r in plain)
    assert plain.replicas == 1 and plain.ring_bound_bytes == 0
    assert "no tensor crossed a device boundary" in plain.table()


def test_ring_allreduce_bytes():
    assert traffic.ring_allreduce_bytes(1000, 1) == 0
    assert traffic.ring_allreduce_bytes(1000, 2) == 1000
    assert traffic.ring_allreduce_bytes(1000, 8) == 1750


def test_convolution_gradients_are_sized_with_their_fused_bias():
    # oneDNN's Grappler pass fuses a convolution's bias gradient into its
    # filter gradient's op; both still go back to the weights' device.
    inputs = keras.Input((6, 6, 2))
    hidden = keras.layers.Conv2D(3, 3, name="conv")(inputs)
    outputs = keras.layers.Dense(2, name="out")(keras.layers.Flatten()(hidden))
    parallel = multigpu.multi_gpu_model(keras.Model(inputs, outputs),
                                        gpus=DEVICES[:2])
    parallel.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6, 6, 2)).astype("float32")
    y = rng.standard_normal((4, 2)).astype("float32")
    transfers = multigpu.placement.step_traffic(parallel, x, y)
    weights = sum(w.nbytes for w in parallel.template.get_weights())
    assert all(t.bytes is not None for t in transfers)
    by_kind = traffic.bytes_by_kind(transfers)
    assert by_kind["weights"] == by_kind["gradients"] == weights
