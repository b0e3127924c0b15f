"""The benchmarked models and their data.

Four workloads, from overhead-bound to compute-bound:

* `demo`: the demo job's model (`multigpu.demo.build_model`) on the demo's
  data (scikit-learn's digit scans, `multigpu.demo.load_digits`), batch 64.
* `cnn`: a small CIFAR-sized CNN on synthetic 32x32x3 images, batch 128.
* `mnist_cnn`: an MNIST-sized CNN (2 conv layers) on synthetic 28x28x1
  images, batch 128: 32 rows per replica on 4 devices, where what each
  replica costs regardless of its rows weighs most.
* `mlp_large`: a wide MLP (3 x 2048 hidden units) on synthetic 3,072-vectors,
  batch 256, where the matrix products of each step dominate its overheads.

Synthetic data is drawn with a fixed seed, so every configuration (and the
R-driven run) trains on the same rows.

One more for the JAX engine's study (`bench.jax_throughput`): `mlp`, a
small MLP (784-256-256-10) on synthetic 784-vectors.

Two more, with BatchNormalization, for the cost studies of
`sync_batchnorm` (`BATCHNORM_WORKLOADS`): `bn_mlp` and `bn_cnn`, on one
synthetic batch each.
"""

import dataclasses

import numpy as np

NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model, its data and how it is trained in the benchmark.

    Attributes:
        name: Short name used in the results.
        description: One line for the report.
        batch_size: Global batch size (split between the devices).
        rounds: Timed epochs per configuration in a full run (one per
            round), after `warmup_epochs` untimed ones.
        warmup_epochs: Untimed first epochs (tracing, caches).
    """

    name: str
    description: str
    batch_size: int
    rounds: int
    warmup_epochs: int


WORKLOADS = {
    "demo": Workload(
        "demo", "multigpu.demo CNN, 1,293 digit scans (8x8x1), batch 64",
        batch_size=64, rounds=40, warmup_epochs=2),
    "cnn": Workload(
        "cnn", "small CNN (4 conv, 1.1M params), 1,024 synthetic 32x32x3 images, "
        "batch 128",
        batch_size=128, rounds=12, warmup_epochs=1),
    "mnist_cnn": Workload(
        "mnist_cnn", "MNIST-sized CNN (2 conv, 57K params), 2,048 synthetic "
        "28x28x1 images, batch 128 (32 rows per replica on 4 devices)",
        batch_size=128, rounds=20, warmup_epochs=1),
    "mlp_large": Workload(
        "mlp_large", "MLP 3072-2048-2048-2048-10 (14.7M params), 1,024 synthetic rows, "
        "batch 256",
        batch_size=256, rounds=10, warmup_epochs=1),
}

# name: (description, batch size, input shape)
BATCHNORM_WORKLOADS = {
    "bn_mlp": ("MLP 784-256-256-10, BatchNormalization after each hidden "
               "layer, batch 256", 256, (784,)),
    "bn_cnn": ("CNN of 3 conv + BatchNormalization blocks (16-32-32 "
               "filters) on 32x32x3, batch 128", 128, (32, 32, 3)),
}


def load_data(name, seed=0, rows=None):
    """Training inputs and integer labels of a workload, as numpy arrays.

    Args:
        name: A key of `WORKLOADS`, or `"mlp"`.
        seed: Seed of the synthetic data.
        rows: Keep only the first `rows` rows (`None`: all of them).

    Returns:
        `(x, y)`: float32 inputs, samples first, and int32 class labels.
    """
    if name == "demo":
        from multigpu.demo import load_digits

        (x, y), _, _ = load_digits(seed)
        return x[:rows], y[:rows].astype("int32")
    rng = np.random.default_rng(seed)
    shape = {"cnn": (1024, 32, 32, 3), "mnist_cnn": (2048, 28, 28, 1),
             "mlp_large": (1024, 3072), "mlp": (2048, 784)}[name]
    x = rng.random(shape, dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, size=shape[0], dtype=np.int32)
    return x[:rows], y[:rows]


def build_model(name):
    """A fresh, uncompiled Keras model of a workload.

    Args:
        name: A key of `WORKLOADS` or of `BATCHNORM_WORKLOADS`, or `"mlp"`.

    Returns:
        A functional `keras.Model` with softmax outputs over 10 classes.
    """
    if name == "demo":
        from multigpu.demo import build_model as demo_model

        return demo_model()
    if name in BATCHNORM_WORKLOADS:
        return _batchnorm_model(name)
    return {"cnn": _small_cnn, "mnist_cnn": _mnist_cnn,
            "mlp_large": _large_mlp, "mlp": _small_mlp}[name]()


def one_batch(name):
    """One batch of a workload: its first rows, or a synthetic batch.

    Args:
        name: A key of `WORKLOADS` (its data's first `batch_size` rows) or
            of `BATCHNORM_WORKLOADS` (a batch drawn with seed 0).

    Returns:
        `(x, y)`: float32 inputs and int32 class labels.
    """
    if name in BATCHNORM_WORKLOADS:
        _, batch, shape = BATCHNORM_WORKLOADS[name]
        rng = np.random.default_rng(0)
        return (rng.random((batch, *shape), dtype=np.float32),
                rng.integers(0, NUM_CLASSES, batch, dtype=np.int32))
    x, y = load_data(name)
    batch = WORKLOADS[name].batch_size
    return x[:batch], y[:batch]


def seeded_start(name):
    """A cost study's starting point for a workload, seeded.

    Seeds Keras (0), then takes one batch and the weights of a fresh build,
    so that every model a study builds starts from the same weights.

    Args:
        name: A workload (see `build_model`).

    Returns:
        `(x, y, weights)`: `one_batch(name)` and the `get_weights()` of
        `build_model(name)`.
    """
    import keras

    keras.utils.set_random_seed(0)
    x, y = one_batch(name)
    return x, y, build_model(name).get_weights()


def parallel_copy(name, weights, devices, **kwargs):
    """`multi_gpu_model` of a fresh model of a workload, compiled.

    The cost studies build their models with this, so A and B differ only
    in what they are built to differ in.

    Args:
        name: A workload (see `build_model`).
        weights: The template's weights (`get_weights()` of another build).
        devices: The devices (`gpus`).
        **kwargs: More arguments of `multi_gpu_model` (`engine`, ...).

    Returns:
        The parallel model, compiled with SGD (learning rate 1e-3) and
        sparse categorical cross-entropy.

    Example:
    >>> weights = build_model("demo").get_weights()
    >>> model = parallel_copy("demo", weights, devices, engine="mirrored")
    """
    import keras

    import multigpu

    template = build_model(name)
    template.set_weights(weights)
    model = multigpu.multi_gpu_model(template, gpus=devices, **kwargs)
    model.compile(optimizer=keras.optimizers.SGD(1e-3),
                  loss="sparse_categorical_crossentropy")
    return model


def _small_cnn():
    import keras

    layers = keras.layers
    inputs = keras.Input((32, 32, 3), name="image")
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dense(256, activation="relu")(x)
    x = layers.Dropout(0.3)(x)
    outputs = layers.Dense(NUM_CLASSES, activation="softmax", name="label")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def _mnist_cnn():
    import keras

    layers = keras.layers
    inputs = keras.Input((28, 28, 1), name="image")
    x = layers.Conv2D(16, 3, activation="relu")(inputs)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(NUM_CLASSES, activation="softmax", name="label")(x)
    return keras.Model(inputs, outputs, name="mnist_cnn")


def _batchnorm_model(name):
    import keras

    layers = keras.layers
    inputs = keras.Input(BATCHNORM_WORKLOADS[name][2])
    x = inputs
    if name == "bn_mlp":
        for units in (256, 256):
            x = layers.Dense(units)(x)
            x = layers.Activation("relu")(layers.BatchNormalization()(x))
    else:
        for filters in (16, 32, 32):
            x = layers.Conv2D(filters, 3, padding="same")(x)
            x = layers.Activation("relu")(layers.BatchNormalization()(x))
            x = layers.MaxPooling2D()(x)
        x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(NUM_CLASSES, activation="softmax")(x)
    return keras.Model(inputs, outputs, name=name)


def _mlp(features, width, depth, name):
    """`depth` ReLU layers of `width` units over `features` inputs, then softmax."""
    import keras

    inputs = keras.Input((features,), name="features")
    x = inputs
    for i in range(depth):
        x = keras.layers.Dense(width, activation="relu", name=f"hidden_{i}")(x)
    outputs = keras.layers.Dense(NUM_CLASSES, activation="softmax",
                                 name="label")(x)
    return keras.Model(inputs, outputs, name=name)


def _small_mlp():
    return _mlp(784, 256, 2, "small_mlp")


def _large_mlp():
    return _mlp(3072, 2048, 3, "large_mlp")


def compile_args():
    """The `compile` arguments every configuration uses."""
    import keras

    return dict(optimizer=keras.optimizers.Adam(1e-3),
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"])
