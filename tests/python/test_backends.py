"""Which Keras backends multi_gpu_model serves, and the error on the others."""

import keras
import numpy as np
import pytest

import multigpu
from multigpu import backends
from multigpu.engines import choice as choice_lib
from multigpu.engines import front


def test_the_tests_run_on_tensorflow_and_it_is_served():
    assert backends.current() == keras.backend.backend() == "tensorflow"
    assert backends.check_supported("multi_gpu_model") == "tensorflow"
    assert set(choice_lib.BACKEND_ENGINES) == set(backends.ENGINE_BACKENDS)


@pytest.mark.parametrize("call", ["multi_gpu_model", "check_equivalence",
                                  "placement_report"])
def test_torch_gets_one_error_naming_the_backends_that_work(monkeypatch, call):
    # Each call finds its backend's way by name: none falls back to another
    # backend's.
    monkeypatch.setattr(backends, "current", lambda: "torch")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    arguments = {"multi_gpu_model": dict(gpus=2),
                 "check_equivalence": dict(x=np.ones((4, 3)), y=np.ones((4, 2))),
                 "placement_report": {}}[call]
    with pytest.raises(backends.UnsupportedBackendError,
                       match=rf"{call}\(\) has no engine for the Keras "
                       r"backend 'torch': it runs on the backends 'tensorflow' "
                       r"and 'jax'.*KERAS_BACKEND=jax"):
        getattr(multigpu, call)(model, **arguments)


def test_the_jax_engine_is_refused_on_tensorflow():
    with pytest.raises(ValueError, match="Invalid `engine`: received 'jax' on "
                       "the TensorFlow backend.*KERAS_BACKEND=jax"):
        front.check_engine("jax")


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_the_tensorflow_engines_are_refused_on_jax_saying_why(engine):
    with pytest.raises(ValueError, match=f"received '{engine}' on the JAX "
                       "backend.*does not run"):
        choice_lib.decide_jax_engine(engine)
    assert choice_lib.decide_jax_engine("auto").engine == "jax"
