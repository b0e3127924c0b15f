"""The guarded step's forward pass runs beside the NaN/inf check, not after it.

`multigpu.step.train_step._guarded_step`: the forward pass, the loss and the
gradients read the variables' values ungated (`multigpu.step.stateless`); only
the writes, the update and the metrics wait for the guard's assertion. On
finite batches it trains as the unguarded step does.
"""

import warnings

import keras
import numpy as np
import pytest

import multigpu
from conftest import DEVICES
from multigpu.step import guard as guard_lib
from multigpu.step.nonfinite import NonFiniteInputError
from support.models import ZOO, zoo_batch

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]
# Two devices make every split these tests need (and the replicas'
# collectives); each more one is another replica to trace.
TWO = DEVICES[:2]


def _template():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.3, seed=3)(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


def _batches(rng, rows=49):
    x = rng.standard_normal((rows, 8, 8, 1)).astype("float32")
    return x, rng.integers(0, 3, rows).astype("int32")


def _state(model):
    return [np.array(v) for v in model.variables + model.optimizer.variables]


def _parallel(template, engine, check_finite, **options):
    if engine == "model_parallel":
        model = multigpu.model_parallel(template, TWO)
    else:
        model = multigpu.multi_gpu_model(template, gpus=TWO,
                                         engine=engine, **options)
    model.check_finite = check_finite
    return model


def _trained(engine, check_finite, x, y, **options):
    model = _parallel(_template(), engine, check_finite, **options)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    # 16, 16, 16 and 1 row: the last batch has fewer rows than devices.
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                        verbose=0)
    return _state(model), history.history


@pytest.mark.parametrize("engine, options", [
    ("replicate", {}), ("mirrored", {}),
    ("mirrored", {"sync_batchnorm": True})])
def test_the_guarded_step_trains_as_the_unguarded_one(rng, engine, options):
    """Weights, BatchNormalization's statistics, Dropout's seeds, the
    optimizer's state and the metrics: as with `check_finite = False`."""
    x, y = _batches(rng)
    got, got_logs = _trained(engine, True, x, y, **options)
    want, want_logs = _trained(engine, False, x, y, **options)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    assert got_logs == pytest.approx(want_logs)


# Each zoo model on one engine, as in test_nonfinite.py.
ZOO_ENGINES = {
    name: ("replicate", "mirrored", "model_parallel")[i % 3]
    for i, name in enumerate(n for n in ZOO if n != "application")}
ZOO_ENGINES["subclassed"] = "replicate"  # model_parallel needs layers


@pytest.mark.parametrize("name, engine", sorted(ZOO_ENGINES.items()))
def test_every_zoo_model_trains_guarded_as_unguarded(rng, name, engine):
    x, y = zoo_batch(ZOO[name](), rng, 8)
    states = []
    for check_finite in (True, False):
        keras.utils.set_random_seed(2)
        model = _parallel(ZOO[name](), engine, check_finite)
        model.compile(optimizer="adam", loss="mse")
        for _ in range(2):
            model.train_on_batch(x, y)
        states.append(_state(model))
    for got, want in zip(*states):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_a_bad_batch_under_sync_batchnorm_writes_nothing(rng, engine):
    """Its forward pass has all-reduces: they end before the assertion
    fails, and the next batch trains."""
    model = _parallel(_template(), engine, True, sync_batchnorm=True)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = _batches(rng, 16)
    model.train_on_batch(x, y)
    before = _state(model)
    bad = x.copy()
    bad[5, 2, 2, 0] = np.nan
    with pytest.raises(NonFiniteInputError, match="NaN"):
        model.train_on_batch(bad, y)
    for got, want in zip(_state(model), before):
        np.testing.assert_array_equal(got, want)
    model.train_on_batch(x, y)
    # As if the bad batch had never come: the same model (Dropout seeded)
    # trained on the good batch twice.
    unbroken = _parallel(_template(), engine, True, sync_batchnorm=True)
    unbroken.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    for _ in range(2):
        unbroken.train_on_batch(x, y)
    for got, want in zip(_state(model), _state(unbroken)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


class _CountsCalls(keras.layers.Layer):
    """Writes a raw `tf.Variable` in its forward pass (not a Keras one)."""

    def build(self, input_shape):
        import tensorflow as tf

        self.calls = tf.Variable(0.0, trainable=False)

    def call(self, x):
        self.calls.assign_add(1.0)
        return x


def test_a_raw_tf_variable_written_in_the_forward_pass_is_warned_of(rng):
    inputs = keras.Input((3,))
    template = keras.Model(
        inputs, keras.layers.Dense(1)(_CountsCalls()(inputs)))
    model = _parallel(template, "replicate", True)
    model.compile(optimizer="sgd", loss="mse")
    x = rng.standard_normal((8, 3)).astype("float32")
    with pytest.warns(UserWarning, match="writes a tf.Variable directly"):
        model.train_on_batch(x, np.zeros((8, 1), "float32"))
    # Unguarded, the step has nothing to hold back: no warning.
    model = _parallel(template, "replicate", False)
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.train_on_batch(x, np.zeros((8, 1), "float32"))


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
    asserted = guard_lib.Record.asserted

    def spying(self, oks, counting):
        graphs.append(tf.compat.v1.get_default_graph())
        return asserted(self, oks, counting)

    monkeypatch.setattr(guard_lib.Record, "asserted", spying)
    model = multigpu.multi_gpu_model(_template(), gpus=TWO, engine=engine)
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
            # Every collective of the forward and backward passes has
            # ended before the assertion can fail (a collective cut short
            # cancels the process's collective executor); those of the
            # update, the gradients' all-reduce with the row counts, wait
            # for it.
            ancestors = _all_ancestors(assertion)
            collectives = [op for op in ops
                           if op.type.startswith("Collective")]
            assert any(waits[op] for op in collectives)
            assert all(op in ancestors or waits[op] for op in collectives)
