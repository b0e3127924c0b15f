"""mirrored_strategy: one device resolver, reuse, key ranges, explained errors."""

import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from multigpu.distribute import strategy as strategy_lib
from support.models import copy_of, data, max_weight_difference, mlp
from support.worker_scripts import WORKERS, fresh_python

RUN_TIMEOUT = 180
# What the script's `support.models` import needs on its path.
TESTS = os.path.dirname(os.path.dirname(WORKERS))


def _devices(strategy):
    return [multigpu.canonical_device_name(d.split("/device:", 1)[-1])
            for d in strategy.extended.worker_devices]


@pytest.mark.parametrize("devices", [None, 2, 3, ["/cpu:1", "/cpu:3"]])
def test_devices_resolve_like_multi_gpu_model(devices):
    strategy = multigpu.mirrored_strategy(devices)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    expected = multigpu.resolve_devices(devices)
    assert _devices(strategy) == expected
    assert strategy.num_replicas_in_sync == len(expected)


def test_invalid_devices_get_the_resolvers_message():
    with pytest.raises(ValueError, match=r"`gpus`/`devices` argument: "
                                         r"received 9"):
        multigpu.mirrored_strategy(9)


def test_invalid_cross_device_ops_are_named():
    with pytest.raises(ValueError, match=r"`cross_device_ops`: received 'x'"):
        multigpu.mirrored_strategy(2, cross_device_ops="x")
    with pytest.raises(TypeError, match=r"`cross_device_ops`: received 3; "
                       r"expected None \(collective all-reduce\), one of "
                       r"'hierarchical_copy', 'nccl', or 'reduce_to_one'"):
        multigpu.mirrored_strategy(2, cross_device_ops=3)
    with pytest.raises(TypeError, match=r"received an object of type dict"):
        multigpu.mirrored_strategy(2, cross_device_ops={})


def test_same_devices_give_the_same_strategy_and_others_a_new_key_range():
    first = multigpu.mirrored_strategy(2)
    assert multigpu.mirrored_strategy(["/cpu:0", "/cpu:1"]) is first
    other = multigpu.mirrored_strategy(4)
    reduced = multigpu.mirrored_strategy(2, cross_device_ops="reduce_to_one")
    assert len({id(first), id(other), id(reduced)}) == 3
    bases = {s._collective_key_base for s in (first, other, reduced)}
    assert len(bases) == 3
    assert min(bases) >= strategy_lib._KEY_BASE_START


def test_a_reset_forgets_the_strategies_but_not_the_keys_handed_out():
    first = multigpu.mirrored_strategy(2)
    strategy_lib.STATE.reset()
    again = multigpu.mirrored_strategy(2)
    assert again is not first
    assert again._collective_key_base > first._collective_key_base
    assert multigpu.mirrored_strategy(2) is again


def _assert_fit_under_trains_as_one_device(strategy, rng, rows=48):
    """Keras's fit under `strategy` equals the model's fit on one device."""
    with strategy.scope():
        model = mlp()
        model.compile(optimizer="sgd", loss="mse")
    reference = copy_of(model)
    reference.compile(optimizer="sgd", loss="mse")
    x, y = data(rng, rows)
    batches = multigpu.distributed_dataset(x, y, 4, strategy=strategy)
    got = model.fit(batches, epochs=1, verbose=0).history["loss"]
    want = reference.fit(x, y, batch_size=4 * strategy.num_replicas_in_sync,
                         shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert max_weight_difference(model, reference) < 1e-5


def test_strategies_over_different_devices_train_in_one_process(rng):
    for devices in (2, 4, ["/cpu:2", "/cpu:3"], 2):
        _assert_fit_under_trains_as_one_device(
            multigpu.mirrored_strategy(devices), rng)


def test_a_batch_that_does_not_split_evenly_gets_an_actionable_error(rng):
    strategy = multigpu.mirrored_strategy(3)
    with strategy.scope():
        model = mlp()
        model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(multigpu.StrategyUsageError,
                       match=r"\[\(6, 8\), \(6, 8\), \(4, 8\)\].*multiple of 3"):
        model.fit(*data(rng, 32), batch_size=16, verbose=0)
    # The fix: batches of a multiple of 3 rows (here 12, 12 and 12), which
    # Keras's fit under the strategy trains as one device does.
    _assert_fit_under_trains_as_one_device(strategy, rng, rows=36)


# Full tier: two device sets in one process train in the gate's test of them.
@pytest.mark.full
def test_coexists_with_a_strategy_made_directly_with_tf_distribute():
    # In a subprocess: a plain MirroredStrategy owns group key 1, and a
    # collision would abort every collective of the process.
    script = textwrap.dedent("""
        import os, sys
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        sys.path.insert(0, sys.argv[1])
        import multigpu
        multigpu.virtual_devices(4)
        import numpy as np, tensorflow as tf
        from support.models import data, mlp
        x, y = data(np.random.default_rng(0), 32)
        def fit(strategy):
            with strategy.scope():
                model = mlp()
                model.compile(optimizer="sgd", loss="mse")
            return model.fit(x, y, batch_size=16, verbose=0).history["loss"][0]
        fit(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
        print("ours", fit(multigpu.mirrored_strategy(4)))
        print("ours", fit(multigpu.mirrored_strategy(["/cpu:2", "/cpu:3"])))
    """)
    result = subprocess.run(fresh_python(script) + [TESTS],
                            capture_output=True, text=True,
                            timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("ours") == 2


def test_a_single_device_machine_gets_one_replica():
    result = subprocess.run(
        [sys.executable, os.path.join(WORKERS, "single_device.py")],
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.split("=", 1) for line in result.stdout.split() if "=" in line)
    assert lines["replicas"] == "1"
    assert lines["batch"] == "8"
    assert lines["finite"] == "True"


@pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                    reason="needs a GPU")
def test_none_uses_every_gpu():
    gpus = tf.config.list_logical_devices("GPU")
    assert multigpu.mirrored_strategy().num_replicas_in_sync == len(gpus)


def test_a_model_built_outside_the_scope_gets_an_actionable_error(rng):
    strategy = multigpu.mirrored_strategy(2)
    model = mlp()  # outside the scope
    with pytest.raises(multigpu.StrategyUsageError,
                       match=r"created outside the strategy's scope") as raised:
        with strategy.scope():
            model.compile(optimizer="sgd", loss="mse")
            model.fit(*data(rng, 16), batch_size=8, verbose=0)
    assert "bare AssertionError" in str(raised.value)
    assert "engine='mirrored'" in str(raised.value)


def test_a_step_outside_strategy_run_gets_an_actionable_error(rng):
    strategy = multigpu.mirrored_strategy(2)
    with strategy.scope():
        model = mlp()
        model.compile(optimizer="sgd", loss="mse")
    x, y = data(rng, 16)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

    with pytest.raises(multigpu.StrategyUsageError,
                       match=r"outside a replica context.*strategy\.run"):
        with strategy.scope():
            step(x, y)


def test_an_optimizer_built_for_another_model_gets_an_actionable_error(rng):
    optimizer = keras.optimizers.SGD()
    optimizer.build(mlp().trainable_variables)
    strategy = multigpu.mirrored_strategy(2)
    with pytest.raises(multigpu.StrategyUsageError,
                       match=r"create a new optimizer"):
        with strategy.scope():
            model = mlp()
            model.compile(optimizer=optimizer, loss="mse")
            model.fit(*data(rng, 16), batch_size=8, verbose=0)


def test_other_errors_pass_through_unchanged():
    with pytest.raises(KeyError, match="unrelated"):
        with multigpu.mirrored_strategy(2).scope():
            raise KeyError("unrelated")
    assert strategy_lib.explain_error(AssertionError()) is None


def test_a_strategy_names_its_devices_so_mixing_errors_say_which():
    strategy = multigpu.mirrored_strategy(["/cpu:2", "/cpu:3"])
    assert repr(strategy) == ("ExplainingMirroredStrategy(devices="
                              "['/device:CPU:2', '/device:CPU:3'])")


@pytest.mark.parametrize("error, match", [
    (ValueError("`colocate_vars_with` must only be passed a variable "
                "created in this tf.distribute.Strategy.scope(), not: <v>"),
     r"created outside the strategy's scope.*TensorFlow reports: "
     r"`colocate_vars_with` must only be passed"),
    (RuntimeError("Mixing different tf.distribute.Strategy objects: A is "
                  "not B"),
     r"^Two tf\.distribute strategies were mixed \(Mixing different "
     r"tf\.distribute\.Strategy objects: A is not B\)\..*"
     r"multigpu\.mirrored_strategy\(devices\) returns the same strategy"),
])
def test_scope_mistakes_tensorflow_reports_are_explained(error, match):
    explained = strategy_lib.explain_error(error)
    assert isinstance(explained, multigpu.StrategyUsageError)
    assert re.search(match, str(explained))


def test_an_explained_error_keeps_tensorflows_as_its_cause():
    first = multigpu.mirrored_strategy(2)
    second = multigpu.mirrored_strategy(["/cpu:2", "/cpu:3"])
    with pytest.raises(multigpu.StrategyUsageError) as raised:
        with first.scope(), second.scope():
            pass
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "Mixing different" in str(raised.value.__cause__)


def test_a_model_parallel_copy_of_a_strategy_built_model_is_allowed(rng):
    # model_parallel places a copy of the weights: mirrored ones copy too.
    with multigpu.mirrored_strategy(2).scope():
        template = mlp()
    reference = copy_of(template)
    partitioned = multigpu.model_parallel(template, 2)
    for model in (partitioned, reference):
        model.compile(optimizer="sgd", loss="mse")
    x, y = data(rng, 16)
    got = partitioned.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    want = reference.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                               rtol=1e-5)
    assert max_weight_difference(partitioned.template, reference) < 1e-5
