"""The guarded step's forward pass runs beside the NaN/inf check, not after it.

`multigpu.training_step._stateless_step`: the forward pass, the loss and the
gradients read the variables' values ungated (`multigpu.stateless`); only
the writes, the update and the metrics wait for the guard's assertion.
"""

import keras
import numpy as np
import pytest

import multigpu
from conftest import DEVICES
from multigpu import finite, training_step

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")


def _template():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.3, seed=3)(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


def _batches(rng, rows=50):
    x = rng.standard_normal((rows, 8, 8, 1)).astype("float32")
    return x, rng.integers(0, 3, rows).astype("int32")


def _trained(engine, stateless, x, y, monkeypatch):
    monkeypatch.setattr(training_step, "STATELESS", stateless)
    model = multigpu.multi_gpu_model(_template(), gpus=DEVICES, engine=engine)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    # 16, 16, 16 and 2 rows: the last batch has fewer rows than devices.
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                        verbose=0)
    state = [np.array(v) for v in model.variables + model.optimizer.variables]
    return state, history.history


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_the_stateless_step_trains_as_the_fully_gated_one(
        rng, engine, monkeypatch):
    """Weights, BatchNormalization's statistics, Dropout's seeds, the
    optimizer's state and the metrics: the same as every op waiting."""
    x, y = _batches(rng)
    got, got_logs = _trained(engine, True, x, y, monkeypatch)
    want, want_logs = _trained(engine, False, x, y, monkeypatch)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    assert got_logs == pytest.approx(want_logs)


def _all_ancestors(op):
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(
                current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_only_the_writes_wait_for_the_assertion(rng, engine, monkeypatch):
    import tensorflow as tf

    graphs = []
    asserted = finite.Record.asserted

    def spying(self, oks, counting):
        graphs.append(tf.compat.v1.get_default_graph())
        return asserted(self, oks, counting)

    monkeypatch.setattr(finite.Record, "asserted", spying)
    model = multigpu.multi_gpu_model(_template(), gpus=DEVICES, engine=engine)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = _batches(rng, 32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert graphs
    for graph in graphs:
        ops = graph.get_operations()
        (assertion,) = [op for op in ops if op.type == "Assert"]
        waits = {op: assertion in _all_ancestors(op) for op in ops}
        # The forward and backward passes: the replicate engine's
        # convolutions, the mirrored engine's replicas' conds.
        compute = [op for op in ops if op.type in (
            "Conv2D", "Conv2DBackpropFilter", "StatelessIf")]
        writes = [op for op in ops if op.type.startswith(
            ("Assign", "ResourceApply"))]
        assert compute and writes
        assert not any(waits[op] for op in compute)
        assert all(waits[op] for op in writes)
        if engine == "mirrored":
            # The loss's all-reduce of the row counts has ended before the
            # assertion can fail (a collective cut short cancels the
            # process's collective executor).
            ancestors = _all_ancestors(assertion)
            collectives = [op for op in ops
                           if op.type.startswith("Collective")]
            assert any(op in ancestors for op in collectives)
            assert all(op in ancestors or waits[op] for op in collectives)
