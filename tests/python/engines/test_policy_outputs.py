"""The global dtype policy does not change what an engine's model computes.

Layers take the global dtype policy when they are created. A
`mixed_float16` policy set after the template was built (or a mixed
template with float32 outputs) must leave the parallel model's outputs the
template's: same dtypes, same values, on every engine.
"""

import keras
import numpy as np
import pytest

import multigpu
from support.models import copy_of

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = pytest.mark.zoo(axes=("engine",), scope="module")

ENGINES = {
    "replicate": lambda t: multigpu.multi_gpu_model(t, gpus=2,
                                                    engine="replicate"),
    "mirrored": lambda t: multigpu.multi_gpu_model(t, gpus=2,
                                                   engine="mirrored"),
    "model_parallel": lambda t: multigpu.model_parallel(t, devices=2),
    "model_parallel_microbatches": lambda t: multigpu.model_parallel(
        t, devices=2, microbatches=2),
}


@pytest.fixture
def set_policy():
    """Sets the global dtype policy; the test's policy is restored after."""
    previous = keras.config.dtype_policy()
    try:
        yield keras.config.set_dtype_policy
    finally:
        keras.config.set_dtype_policy(previous)


def _two_heads():
    """A head under the global policy and a head pinned to float32."""
    inputs = keras.Input((4,), name="features")
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
    policy_head = keras.layers.Dense(3, name="policy_head")(hidden)
    float32_head = keras.layers.Dense(2, activation="softmax", dtype="float32",
                                      name="float32_head")(hidden)
    return keras.Model(inputs, [policy_head, float32_head], name="two_heads")


class _Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(6, activation="tanh")
        self.out = keras.layers.Dense(3)

    def call(self, x):
        return self.out(self.hidden(x))


def _x():
    # Values float16 would round (about 3 significant digits).
    return np.random.default_rng(3).standard_normal((8, 4)).astype(
        "float32") * 3.3


def _assert_like_template(parallel, template, x):
    expected = [np.asarray(y) for y in keras.tree.flatten(template(x))]
    got = [np.asarray(y) for y in keras.tree.flatten(parallel(x))]
    assert [str(y.dtype) for y in got] == [str(y.dtype) for y in expected]
    assert [t.dtype for t in keras.tree.flatten(parallel.outputs)] == [
        str(y.dtype) for y in expected]
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_policy_set_after_the_template_leaves_outputs_alone(set_policy,
                                                            engine):
    template = _two_heads()
    set_policy("mixed_float16")
    parallel = ENGINES[engine](copy_of(template))
    assert keras.config.dtype_policy().name == "mixed_float16"
    _assert_like_template(parallel, template, _x())


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_policy_set_after_a_subclassed_template_leaves_outputs_alone(
        set_policy, engine):
    template = _Subclassed(name="subclassed")
    template(_x()[:1])
    set_policy("mixed_float16")
    parallel = ENGINES[engine](template)
    _assert_like_template(parallel, template, _x())


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_mixed_template_keeps_its_float16_and_float32_outputs(set_policy,
                                                                engine):
    set_policy("mixed_float16")
    template = _two_heads()
    parallel = ENGINES[engine](copy_of(template))
    assert [t.dtype for t in parallel.outputs] == ["float16", "float32"]
    _assert_like_template(parallel, template, _x())
