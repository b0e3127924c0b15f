"""Custom gradients of a train step live with its graph, not in the registry."""

import gc

import tensorflow as tf
from tensorflow.python.framework import ops as ops_lib

import multigpu
from multigpu.step import gradients
from support.models import mlp


def _registered():
    return set(ops_lib._gradient_registry.list())


def _build_and_fit(x, y):
    model = multigpu.multi_gpu_model(mlp(), gpus=2)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return model


def test_building_parallel_models_does_not_grow_the_gradient_registry(rng):
    x = rng.standard_normal((16, 8)).astype("float32")
    y = rng.standard_normal((16, 3)).astype("float32")
    _build_and_fit(x, y)
    before = _registered()
    for _ in range(2):
        _build_and_fit(x, y)
        gc.collect()
    assert _registered() - before == set()


def test_moved_gradients_still_differentiate():
    @tf.custom_gradient
    def doubled_gradient(v):
        return tf.identity(v), lambda dy: 2 * dy

    @tf.function
    def grad(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            with gradients.gradients_owned_by_ops():
                y = doubled_gradient(v) * 3.0
        symbolic = tf.gradients(y, v)[0]
        return tape.gradient(y, v), symbolic

    before = _registered()
    taped, symbolic = grad(tf.constant(1.0))
    assert float(taped) == 6.0 and float(symbolic) == 6.0
    assert _registered() == before
