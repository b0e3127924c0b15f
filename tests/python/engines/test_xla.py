"""XLA on the TensorFlow engines: `compile(jit_compile=True)` per replica.

Each replica's forward pass and its gradient are one XLA-compiled function
on the replica's device (`device_pass.compiled_on`, `device_pass.run_pass`); the
numbers are the template's trained by plain Keras on one device with
`jit_compile=True` too, on even and uneven batches and on a batch with
fewer rows than devices. What XLA cannot compile runs without it, with a
warning naming `jit_compile` and its value, and the model's `jit_compile`
says so. Tiny models on 2 devices: XLA compiles once per share's shape.
"""

import collections
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from multigpu.placement.graphs import executed_node_defs
from support.models import copy_of, max_weight_difference, mlp

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]

TOLERANCE = 1e-5
ENGINES = ["replicate", "mirrored"]


def small_cnn():
    inputs = keras.Input((6, 6, 1), name="image")
    x = keras.layers.Conv2D(3, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax", name="label")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def embedding_pooling():
    tokens = keras.Input((5,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(20, 4)(tokens)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(3, activation="softmax", name="label")(x)
    return keras.Model(tokens, outputs, name="embedding_pooling")


def _batches(rng, shape, sizes):
    """Batches of `sizes` rows (4: split 2/2 on 2 devices, 3: 1/2, 1: one row).

    Returns `(dataset, loss)`; integer labels for a softmax model, whose
    loss reads the logits Keras attaches to its outputs.
    """
    rows = sum(sizes)
    if shape == "mlp":
        x = rng.standard_normal((rows, 8)).astype("float32")
        y = rng.standard_normal((rows, 3)).astype("float32")
        loss = "mse"
    else:
        if shape == "small_cnn":
            x = rng.standard_normal((rows, 6, 6, 1)).astype("float32")
        else:  # integer tokens and labels: no NaN guard, Keras's step
            x = rng.integers(0, 20, size=(rows, 5)).astype("int32")
        y = rng.integers(0, 3, size=rows).astype("int32")
        loss = "sparse_categorical_crossentropy"
    rows_of = tf.data.Dataset.from_tensor_slices((x, y))
    dataset, start = None, 0
    for size in sizes:
        batch = rows_of.skip(start).take(size).batch(size)
        dataset = batch if dataset is None else dataset.concatenate(batch)
        start += size
    return dataset, loss


MODELS = {"mlp": mlp, "small_cnn": small_cnn,
          "embedding_pooling": embedding_pooling}


# XLA compiles each share's shape once per device, the reference each
# batch's, which is most of these tests' time: the MLP takes the three
# kinds of batch on both engines, the convolutional net (floating-point
# data: the NaN guard's step) and the embedding (integer tokens and labels:
# Keras's step) an uneven one on one engine each.
@pytest.mark.parametrize("engine, shape, sizes", [
    ("replicate", "mlp", (4, 3, 1)), ("mirrored", "mlp", (4, 3, 1)),
    ("replicate", "small_cnn", (3,)),
    ("mirrored", "embedding_pooling", (3,)),
])
def test_training_with_xla_equals_the_template_with_xla(rng, engine, shape,
                                                       sizes):
    template = MODELS[shape]()
    reference = copy_of(template)
    dataset, loss = _batches(rng, shape, sizes)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    parallel.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss,
                     jit_compile=True)
    reference.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss,
                      jit_compile=True)
    assert parallel.jit_compile is True
    got = parallel.fit(dataset, epochs=1, verbose=0)
    want = reference.fit(dataset, epochs=1, verbose=0)
    assert max_weight_difference(template, reference) < TOLERANCE
    np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                               rtol=TOLERANCE)


def _compiled_calls(nodes):
    """`{device: function names}` of the executed calls XLA must compile."""
    calls = collections.defaultdict(list)
    for device, node in nodes:
        if node.op.endswith("PartitionedCall") and (
                "_XlaMustCompile" in node.attr
                and node.attr["_XlaMustCompile"].b):
            calls[device].append(node.attr["f"].func.name)
    return dict(calls)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_replicas_forward_and_backward_pass_run_under_xla(rng, engine):
    template = mlp()
    reference = copy_of(template)
    x = rng.standard_normal((4, 8)).astype("float32")
    y = rng.standard_normal((4, 3)).astype("float32")
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    parallel.compile(optimizer="sgd", loss="mse")
    # Set after `compile`, as Keras's attribute can be.
    parallel.jit_compile = True
    assert parallel.jit_compile is True
    _, nodes = executed_node_defs(parallel.train_on_batch, x, y)
    # Without XLA, TensorFlow's MatMul and ReluGrad kernels of the pass and
    # of its gradient run on both devices; here XLA runs them.
    assert not [node.name for _, node in nodes
                if node.op in ("MatMul", "_FusedMatMul", "ReluGrad")]
    # One compiled forward call and one compiled gradient call per device.
    calls = _compiled_calls(nodes)
    assert sorted(calls) == ["/device:CPU:0", "/device:CPU:1"]
    for names in calls.values():
        assert len(names) == 2, calls
        assert len([n for n in names if "backward" in n]) == 1, calls
    reference.compile(optimizer="sgd", loss="mse", jit_compile=True)
    reference.train_on_batch(x, y)
    assert max_weight_difference(template, reference) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_jit_compile_auto_is_what_keras_gives_the_template(engine):
    template = mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    parallel.compile(optimizer="sgd", loss="mse", jit_compile="auto")
    reference.compile(optimizer="sgd", loss="mse", jit_compile="auto")
    # A machine without GPUs: Keras runs without XLA.
    assert parallel.jit_compile is reference.jit_compile is False
    parallel.compile(optimizer="sgd", loss="mse")
    assert parallel.jit_compile is False


class NoJit(keras.layers.Layer):
    """A layer Keras says XLA cannot compile (as string preprocessing)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False

    def call(self, x):
        return x * 2.0


def _no_jit_model():
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(2)(NoJit(name="nojit")(
        inputs)))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_model_xla_cannot_compile_trains_without_it_and_says_so(rng,
                                                                  engine):
    template = _no_jit_model()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    with pytest.warns(UserWarning, match=(
            r"^jit_compile=True: the replicas run without XLA, as its layer "
            r"'nojit' \(NoJit\) is one XLA cannot compile")):
        parallel.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert parallel.jit_compile is False
    if engine == "mirrored":
        return  # the same step as without jit_compile: trained below
    reference.compile(optimizer="sgd", loss="mse", jit_compile=False)
    x = rng.standard_normal((5, 3)).astype("float32")
    y = rng.standard_normal((5, 2)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = parallel.fit(x, y, batch_size=5, verbose=0)
    want = reference.fit(x, y, batch_size=5, verbose=0)
    np.testing.assert_allclose(got.history["loss"], want.history["loss"],
                               rtol=TOLERANCE)
    assert max_weight_difference(template, reference) < TOLERANCE


def test_sync_batchnorm_and_run_eagerly_run_without_xla():
    parallel = multigpu.multi_gpu_model(mlp(), gpus=2, engine="replicate",
                                        sync_batchnorm=True)
    with pytest.warns(UserWarning, match=r"sync_batchnorm=True"):
        parallel.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert parallel.jit_compile is False
    eager = multigpu.multi_gpu_model(mlp(), gpus=2, engine="replicate")
    with pytest.warns(UserWarning, match=r"run_eagerly=True"):
        eager.compile(optimizer="sgd", loss="mse", jit_compile=True,
                      run_eagerly=True)
    assert eager.jit_compile is False
