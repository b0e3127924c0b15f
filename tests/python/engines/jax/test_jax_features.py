"""What else runs on JAX: each feature against one device, or one refusal.

`check_equivalence`, `ScalingMonitor`, `memory_plan`, `find_batch_size`
and `make_or_restore_model` work on JAX and are checked against one device
or exact counts; the calls that need TensorFlow raise the one
`UnsupportedBackendError` of `multigpu.backends.require_backend`, naming
themselves. Like the rest of this folder, these tests need a process
started with `KERAS_BACKEND=jax` (see test_jax_engine.py).
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import multigpu
from multigpu import backends, tensorflow_internals
from multigpu.insight import memory_plan as memory_lib
from multigpu.messages import language
from support.models import copy_of, normalized_mlp

TOLERANCE = 1e-5




def rows_of(rows, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 6)).astype("float32"),
            rng.standard_normal((rows, 3)).astype("float32"))


def test_importing_multigpu_on_jax_builds_no_tensorflow_engine():
    # A fresh process: this one may have imported anything by now.
    code = (
        "import sys, multigpu\n"
        "from multigpu import tensorflow_internals\n"
        "engines = [m for m in sys.modules\n"
        "           if m.startswith('multigpu.engines.tensorflow')]\n"
        "print(engines, tensorflow_internals.tensorflow_started())\n")
    environment = dict(os.environ, KERAS_BACKEND="jax")
    done = subprocess.run([sys.executable, "-c", code], env=environment,
                          capture_output=True, text=True, timeout=600,
                          check=True)
    assert done.stdout.strip().splitlines()[-1] == "[] False"


def test_check_equivalence_compares_the_jax_engine_with_one_device():
    model = normalized_mlp()
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    before = [w.copy() for w in model.get_weights()]
    x, y = rows_of(42)
    report = multigpu.check_equivalence(model, x, y, gpus=4, steps=2,
                                        batch_size=10, tolerance=TOLERANCE)
    assert report.equal and report.engine == "jax", str(report)
    # BatchNormalization's statistics over the whole batch: compared too.
    assert set(report.differences) == {"loss", "mae", "weights",
                                       "batchnorm_statistics",
                                       "optimizer_state"}
    assert max(report.differences.values()) < TOLERANCE
    # The model is put back as it was.
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)
    with pytest.raises(ValueError, match="Invalid `engine`: received "
                       "'replicate' on the JAX backend"):
        multigpu.check_equivalence(model, x, y, gpus=2, engine="replicate")


def test_scaling_monitor_measures_without_changing_training():
    template = normalized_mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=2)
    for model in (parallel, reference):
        model.compile(optimizer="adam", loss="mse")
    x, y = rows_of(48)
    monitor = multigpu.ScalingMonitor(baseline_steps=3, warmup_steps=1,
                                      warn=False)
    fitted = parallel.fit(x, y, batch_size=8, shuffle=False, verbose=0,
                          callbacks=[monitor]).history
    expected = reference.fit(x, y, batch_size=8, shuffle=False,
                             verbose=0).history
    # The baseline trains a copy: the model trains as on one device.
    np.testing.assert_allclose(fitted["loss"], expected["loss"], rtol=TOLERANCE)
    for ours, theirs in zip(template.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(ours, theirs, atol=TOLERANCE)
    summary = monitor.summary()
    assert (summary["devices"], summary["engine"], summary["batch_size"]) == (
        2, "jax", 8)
    assert summary["steps"] == 6 - 1  # all but the warm-up step
    assert summary["baseline_step_seconds"] > 0 and summary["step_seconds"] > 0
    assert summary["speedup"] == pytest.approx(
        summary["baseline_step_seconds"] / summary["step_seconds"])
    assert summary["communication_seconds"] is None
    assert len(monitor.history()["seconds"]) == summary["steps"]
    assert not tensorflow_internals.tensorflow_started()


def test_memory_plan_counts_the_same_bytes_on_jax():
    model = normalized_mlp()
    model.compile(optimizer="adam", loss="mse")
    plan = multigpu.memory_plan(model, batch_size=10, gpus=2)
    weights = 4 * sum(int(np.prod(v.shape)) for v in model.variables)
    trainable = 4 * sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert (plan["weights"], plan["gradients"]) == (weights, trainable)
    # Adam: two moments per weight, its iteration count and learning rate.
    assert plan["optimizer"] == 2 * trainable + 4 + 4
    assert plan.per_replica_batch == 5
    assert plan["activations"] == memory_lib.activation_bytes(model, 5)
    # The TensorFlow trace's count (activation_bytes' example): the batch
    # (2 x 4 floats), the product and the sum with the bias (2 x 8 each).
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8)])
    assert memory_lib.activation_bytes(dense, 2) == 4 * (8 + 16 + 16)
    memory = plan["total"] * 4
    batch = multigpu.find_batch_size(model, gpus=2, device_memory=memory)
    assert batch % 2 == 0
    assert multigpu.memory_plan(model, batch, gpus=2,
                                device_memory=memory).fits
    assert not multigpu.memory_plan(model, batch + 2, gpus=2,
                                    device_memory=memory).fits
    assert not tensorflow_internals.tensorflow_started()


def test_make_or_restore_model_restores_the_newest_checkpoint(tmp_path):
    model = normalized_mlp()
    model.compile(optimizer="adam", loss="mse")
    x, _ = rows_of(4)
    model.save(tmp_path / "ckpt-2.keras")
    restored = multigpu.make_or_restore_model(
        tmp_path, lambda: pytest.fail("a checkpoint exists"))
    np.testing.assert_allclose(restored.predict(x, verbose=0),
                               model.predict(x, verbose=0), atol=TOLERANCE)


def test_checkpoint_callbacks_resume_a_finished_epoch_on_jax(tmp_path):
    # The exact resume after kills and signals, against an uninterrupted
    # run, is tests/python/checkpoints/test_resume.py's "jax" path.
    x, y = rows_of(16)

    def trained(epochs):
        keras.utils.set_random_seed(5)
        parallel = multigpu.multi_gpu_model(normalized_mlp(), gpus=2)
        parallel.compile(optimizer="adam", loss="mse")
        history = parallel.fit(
            x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
            callbacks=multigpu.checkpoint_callbacks(tmp_path / "ckpt"))
        return parallel, history

    _, first = trained(2)
    assert len(first.history["loss"]) == 2
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.keras")) == [
        "ckpt-1.keras", "ckpt-2.keras"]
    resumed, second = trained(3)
    # Two epochs were done: only the third trains.
    assert len(second.history["loss"]) == 1
    keras.utils.set_random_seed(5)
    alone = normalized_mlp()
    alone.compile(optimizer="adam", loss="mse")
    alone.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    for got, want in zip(resumed.get_weights(), alone.get_weights()):
        np.testing.assert_allclose(got, want, atol=TOLERANCE)


def _compiled_plain():
    model = normalized_mlp()
    model.compile(optimizer="sgd", loss="mse")
    return model


REFUSED = {
    "multigpu.mirrored_strategy()": lambda tmp: multigpu.mirrored_strategy(),
    "multigpu.multi_worker_strategy()":
        lambda tmp: multigpu.multi_worker_strategy(),
    "multigpu.fit_distributed()":
        lambda tmp: multigpu.fit_distributed(_compiled_plain(), None),
    "multigpu.distributed_dataset()":
        lambda tmp: multigpu.distributed_dataset(rows_of(4)[0]),
    "multigpu.check_equivalence() with engine='strategy'":
        lambda tmp: multigpu.check_equivalence(
            _compiled_plain(), *rows_of(8), gpus=2, engine="strategy"),
    "multigpu.find_batch_size() with trial=True":
        lambda tmp: multigpu.find_batch_size(
            normalized_mlp(), gpus=2, device_memory=2**20, trial=True),
}


@pytest.mark.parametrize("call", list(REFUSED))
def test_calls_that_need_tensorflow_raise_one_error_naming_themselves(
        call, tmp_path):
    with pytest.raises(backends.UnsupportedBackendError) as raised:
        REFUSED[call](tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{call} runs on the Keras backend "
                              "'tensorflow' only, and Keras runs on 'jax': "
                              "it needs ")
    assert "KERAS_BACKEND=tensorflow" in message


def test_the_refusal_reads_in_r_for_r_users():
    with language("r"), pytest.raises(backends.UnsupportedBackendError) as raised:
        multigpu.mirrored_strategy()
    message = str(raised.value)
    assert message.startswith("mirrored_strategy() runs on the Keras backend "
                              "\"tensorflow\" only, and Keras runs on \"jax\"")
    assert message.endswith("call keras3::use_backend(\"tensorflow\") before "
                            "Keras is first used in the R session.")
