"""On JAX, a model whose class brings its own loss hook is refused too.

Keras's JAX trainer takes the loss and its gradient from
`compute_loss_and_updates`, which calls `stateless_compute_loss`: a model
overriding either was trained by the JAX engine with the standard loss, and
no word. Like the rest of this folder, these tests need a process started
with `KERAS_BACKEND=jax` (conftest.py).
"""

import keras
import numpy as np
import pytest

import multigpu
from multigpu.engines import own_steps
from multigpu.messages import language

# Every method a model may override to change a step on JAX, written out:
# dropping one from `own_steps` fails these tests.
JAX_STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss",
                    "compute_metrics", "compute_loss_and_updates",
                    "stateless_compute_loss")
ADVICE = ("`keras.distribution.set_distribution("
          "keras.distribution.DataParallel())`")


def _own(name):
    """A functional model whose class overrides `name`, unchanged."""
    standard = getattr(keras.Model, name)
    cls = type(f"Own_{name}", (keras.Model,),
               {name: lambda self, *a, **k: standard(self, *a, **k)})
    inputs = keras.Input((4,), name="features")
    return cls(inputs, keras.layers.Dense(2, name="scores")(inputs),
               name="own")


class L1Loss(keras.Model):
    """The loss hook of Keras's JAX trainer, returning the mean absolute error."""

    def compute_loss_and_updates(self, trainable_variables,
                                 non_trainable_variables, metrics_variables,
                                 x, y, sample_weight, training=False,
                                 optimizer_variables=None):
        _, aux = super().compute_loss_and_updates(
            trainable_variables, non_trainable_variables, metrics_variables,
            x, y, sample_weight, training=training,
            optimizer_variables=optimizer_variables)
        loss = keras.ops.mean(keras.ops.abs(aux[1] - y))
        return loss, (loss,) + tuple(aux[1:])


def test_the_jax_trainer_s_hooks_are_step_methods():
    assert own_steps.step_methods() == JAX_STEP_METHODS


@pytest.mark.parametrize("name", JAX_STEP_METHODS)
def test_a_model_with_its_own_hook_is_refused_by_name(name):
    model = _own(name)
    assert own_steps.overridden_steps(model) == [name]
    with pytest.raises(ValueError) as caught:
        multigpu.multi_gpu_model(model, gpus=2, engine="jax")
    message = str(caught.value)
    assert message.startswith("Invalid `model`: 'own' is a ")
    assert f"defines its own `{name}`." in message
    assert "multigpu.multi_gpu_model() runs Keras's standard steps" in message
    # The fix on JAX: the strategies the TensorFlow message names are
    # TensorFlow's.
    assert ADVICE in message and "mirrored_strategy" not in message


def test_the_refusal_reads_in_r():
    with language("r"):
        with pytest.raises(ValueError) as caught:
            own_steps.check_standard_steps(_own("stateless_compute_loss"),
                                           "multi_gpu_model")
    message = str(caught.value)
    assert '"own"' in message and "multi_gpu_model()" in message
    assert ("`keras$distribution$set_distribution("
            "keras$distribution$DataParallel())`") in message


def test_standard_models_have_no_hook_of_their_own():
    sequential = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    assert own_steps.overridden_steps(sequential) == []
    multigpu.multi_gpu_model(sequential, gpus=2, engine="jax")


def _fit(rng_seed=3):
    rng = np.random.default_rng(rng_seed)
    x = rng.standard_normal((16, 4)).astype("float32")
    y = (10.0 + rng.standard_normal((16, 2))).astype("float32")
    keras.utils.set_random_seed(5)
    inputs = keras.Input((4,))
    model = L1Loss(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                     verbose=0).history["loss"]


def test_the_advised_distribution_runs_the_model_s_own_hook():
    """What the error advises: Keras's fit under DataParallel runs the hook."""
    alone = _fit()
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        distributed = _fit()
    finally:
        keras.distribution.set_distribution(None)
    # The model's own loss, the mean absolute error (~10), not the mse (~100).
    assert alone[0] < 20
    np.testing.assert_allclose(distributed, alone, rtol=1e-5)
