"""The layer zoo: every Keras layer family with behaviour of its own, differentially.

Each case is a tiny model built around one layer family (preprocessing
adapted to data, lookups, the normalizations, RNNs with dropout and masks,
attention with masks, regularizers, `add_loss`, random layers). Built twice
from one seed, one copy goes through `multi_gpu_model` on 2 devices, the
other is trained by plain Keras on one device. On each engine, with an epoch
of batches that split evenly, unevenly, and leave a device without rows
(`BATCHES`):

* predictions equal the template's before training;
* a deterministic layer trains like the template for two epochs: weights
  within `TOL`, the logged loss and metrics too;
* a random layer (its draws differ between one device and two) trains:
  finite loss and weights that moved, and the parallel model predicts what
  its template predicts afterwards.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu

TOL = 1e-5
ENGINES = ("replicate", "mirrored")
# One epoch's batches on `DEVICES`: 4 rows split 2/2, 5 rows split unevenly
# (2/3), and 1 row, which leaves one device without rows. Two devices make
# every split of the claim; each more one is another replica to trace.
DEVICES = 2
BATCHES = (4, 5, 1)
ROWS = sum(BATCHES)
FIT = dict(epochs=2, verbose=0)


def _features(rows, width=6, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, width)) * 4 + 2).astype("float32")


def _regression(rows, outputs=2):
    x = _features(rows)
    w = np.linspace(-1, 1, x.shape[1] * outputs).reshape(x.shape[1], outputs)
    return x, (np.tanh(x @ w / 8)).astype("float32")


def _tokens(rows, length=7, vocabulary=20, seed=4):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocabulary, (rows, length))
    # Trailing padding of varied length, for the masks.
    for i in range(rows):
        tokens[i, length - i % 4:] = 0
    return tokens.astype("int32")


def _labels(rows, classes=3, seed=5):
    return np.random.default_rng(seed).integers(0, classes, rows).astype(
        "int32")


WORDS = ["red", "green", "blue", "cyan", "black", "white", "grey"]


def _words(rows, seed=6):
    rng = np.random.default_rng(seed)
    return np.array([[WORDS[i]] for i in rng.integers(0, len(WORDS), rows)])


def _sentences(rows, seed=7):
    rng = np.random.default_rng(seed)
    return np.array([" ".join(WORDS[j] for j in rng.integers(0, 7, 1 + i % 5))
                     for i in range(rows)])


def _head(x, outputs=2, activation=None):
    return keras.layers.Dense(outputs, activation=activation, name="head")(x)


# Each family: (build, data, loss, deterministic). `build()` makes the
# model, adapting its preprocessing to fixed data; `data(rows)` gives
# `(x, y)`.


def _normalization():
    inputs = keras.Input((6,))
    norm = keras.layers.Normalization()
    norm.adapt(_features(40, seed=11))
    hidden = keras.layers.Dense(5, activation="relu")(norm(inputs))
    return keras.Model(inputs, _head(hidden))


def _discretization():
    inputs = keras.Input((6,))
    bins = keras.layers.Discretization(num_bins=4)
    bins.adapt(_features(40, seed=12))
    encoded = keras.layers.Embedding(4, 3)(bins(inputs))
    return keras.Model(inputs, _head(keras.layers.Flatten()(encoded)))


def _integer_lookup():
    inputs = keras.Input((7,), dtype="int32")
    lookup = keras.layers.IntegerLookup(output_mode="multi_hot")
    lookup.adapt(_tokens(30, seed=13))
    return keras.Model(inputs, _head(lookup(inputs), 3, "softmax"))


def _string_lookup():
    inputs = keras.Input((1,), dtype="string")
    lookup = keras.layers.StringLookup(output_mode="one_hot")
    lookup.adapt(_words(30, seed=14))
    return keras.Model(inputs, _head(lookup(inputs), 3, "softmax"))


def _text_vectorization():
    inputs = keras.Input((), dtype="string")
    vectorize = keras.layers.TextVectorization(output_sequence_length=5)
    vectorize.adapt(_sentences(30, seed=15))
    embedded = keras.layers.Embedding(10, 4, mask_zero=True)(
        vectorize(inputs))
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    return keras.Model(inputs, _head(pooled, 3, "softmax"))


def _hashing_and_encoding():
    inputs = keras.Input((7,), dtype="int32")
    hashed = keras.layers.Hashing(num_bins=8)(inputs)
    encoded = keras.layers.CategoryEncoding(8, output_mode="count")(hashed)
    return keras.Model(inputs, _head(encoded, 3, "softmax"))


def _normalizations():
    inputs = keras.Input((6,))
    x = keras.layers.Dense(8)(inputs)
    x = keras.layers.LayerNormalization()(x)
    x = keras.layers.GroupNormalization(groups=2)(x)
    x = keras.layers.UnitNormalization()(x)
    return keras.Model(inputs, _head(x))


def _batch_normalization():
    # Per-device statistics would differ from the template's by design:
    # checked with sync_batchnorm=True, which pools them.
    inputs = keras.Input((6,))
    x = keras.layers.Dense(8)(inputs)
    x = keras.layers.BatchNormalization()(x)
    return keras.Model(inputs, _head(keras.layers.Activation("relu")(x)))


def _masked_rnns():
    inputs = keras.Input((7,), dtype="int32")
    x = keras.layers.Embedding(20, 4, mask_zero=True)(inputs)
    # A masked LSTM alone is in test_shape_zoo.py; each RNN here costs a trace
    # of its loop per replica.
    x = keras.layers.Bidirectional(keras.layers.GRU(3))(x)
    return keras.Model(inputs, _head(x, 3, "softmax"))


def _rnn_dropout():
    inputs = keras.Input((7,), dtype="int32")
    x = keras.layers.Embedding(20, 4, mask_zero=True)(inputs)
    x = keras.layers.LSTM(4, dropout=0.2, recurrent_dropout=0.1,
                          return_sequences=True)(x)
    x = keras.layers.GRU(4, dropout=0.3)(x)
    return keras.Model(inputs, _head(x, 3, "softmax"))


def _masked_attention():
    inputs = keras.Input((7,), dtype="int32")
    x = keras.layers.Embedding(20, 8, mask_zero=True)(inputs)
    x = keras.layers.MultiHeadAttention(2, 4)(x, x, use_causal_mask=True)
    x = keras.layers.Attention()([x, x])
    return keras.Model(inputs, _head(keras.layers.GlobalAveragePooling1D()(x),
                                     3, "softmax"))


def _convolutions():
    inputs = keras.Input((6, 1))
    x = keras.layers.Conv1D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling1D()(x)
    x = keras.layers.Conv1D(4, 2, activation="relu")(x)
    return keras.Model(inputs, _head(keras.layers.GlobalMaxPooling1D()(x)))


def _image_preprocessing():
    # MaxPooling before a convolution: oneDNN's kernels fail on zero rows.
    inputs = keras.Input((10, 10, 1))
    x = keras.layers.Rescaling(0.5, offset=-1.0)(inputs)
    x = keras.layers.Resizing(8, 8)(x)
    x = keras.layers.CenterCrop(6, 6)(x)
    x = keras.layers.Conv2D(3, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(4, 2, activation="relu")(x)
    return keras.Model(inputs, _head(keras.layers.GlobalAveragePooling2D()(x)))


def _image_augmentation():
    inputs = keras.Input((10, 10, 1))
    x = keras.layers.RandomFlip()(inputs)
    x = keras.layers.RandomRotation(0.1)(x)
    x = keras.layers.RandomZoom(0.1)(x)
    x = keras.layers.RandomTranslation(0.1, 0.1)(x)
    x = keras.layers.RandomContrast(0.2)(x)
    x = keras.layers.Conv2D(3, 3, activation="relu")(x)
    return keras.Model(inputs, _head(keras.layers.GlobalAveragePooling2D()(x)))


def _regularizers():
    inputs = keras.Input((6,))
    x = keras.layers.Dense(
        5, activation="tanh",
        kernel_regularizer=keras.regularizers.L2(0.01),
        bias_regularizer=keras.regularizers.L1(0.01),
        activity_regularizer=keras.regularizers.L1L2(0.01, 0.02))(inputs)
    return keras.Model(inputs, _head(x))


@keras.saving.register_keras_serializable(package="layer_zoo")
class SquaredMeanPenalty(keras.layers.Layer):
    """Adds `rate * mean(x) ** 2` per row as a loss: a mean over the rows."""

    def __init__(self, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, x):
        self.add_loss(self.rate * keras.ops.mean(
            keras.ops.square(keras.ops.mean(x, axis=-1))))
        return x

    def get_config(self):
        return {**super().get_config(), "rate": self.rate}


def _added_loss():
    inputs = keras.Input((6,))
    x = keras.layers.Dense(5, activation="tanh")(inputs)
    x = SquaredMeanPenalty(0.5)(x)
    return keras.Model(inputs, _head(x))


def _random_layers():
    inputs = keras.Input((6, 1))
    x = keras.layers.GaussianNoise(0.1)(inputs)
    x = keras.layers.SpatialDropout1D(0.2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(0.3)(keras.layers.Dense(8, activation="relu")(x))
    x = keras.layers.GaussianDropout(0.2)(x)
    x = keras.layers.AlphaDropout(0.1)(x)
    return keras.Model(inputs, _head(x))


def _regression_data(rows):
    return _regression(rows)


def _sequence_data(rows):
    x, y = _regression(rows)
    return x[..., None], y


def _image_data(rows):
    images = np.random.default_rng(8).standard_normal((rows, 10, 10, 1))
    targets = np.tanh(images[:, :5].mean(axis=(1, 2)) * [[1.0, -2.0]])
    return images.astype("float32"), targets.astype("float32")


def _token_data(rows):
    return _tokens(rows), _labels(rows)


# Keras takes string batches as tensors (not NumPy's str or object arrays).
def _word_data(rows):
    return tf.constant(_words(rows)), _labels(rows)


def _sentence_data(rows):
    return tf.constant(_sentences(rows)), _labels(rows)


SPARSE = "sparse_categorical_crossentropy"
FAMILIES = {
    "normalization": (_normalization, _regression_data, "mse", True),
    "discretization": (_discretization, _regression_data, "mse", True),
    "integer_lookup": (_integer_lookup, _token_data, SPARSE, True),
    "string_lookup": (_string_lookup, _word_data, SPARSE, True),
    "text_vectorization": (_text_vectorization, _sentence_data, SPARSE,
                           True),
    "hashing": (_hashing_and_encoding, _token_data, SPARSE, True),
    "normalizations": (_normalizations, _regression_data, "mse", True),
    "batch_normalization": (_batch_normalization, _regression_data, "mse",
                            True),
    "masked_rnns": (_masked_rnns, _token_data, SPARSE, True),
    "rnn_dropout": (_rnn_dropout, _token_data, SPARSE, False),
    "masked_attention": (_masked_attention, _token_data, SPARSE, True),
    "convolutions": (_convolutions, _sequence_data, "mse", True),
    "image_preprocessing": (_image_preprocessing, _image_data, "mse", True),
    "image_augmentation": (_image_augmentation, _image_data, "mse", False),
    "regularizers": (_regularizers, _regression_data, "mse", True),
    "add_loss": (_added_loss, _regression_data, "mse", True),
    "random_layers": (_random_layers, _sequence_data, "mse", False),
}


def _built(name):
    keras.utils.set_random_seed(21)
    return FAMILIES[name][0]()


def _metrics(loss):
    return ["accuracy"] if loss == SPARSE else ["mae"]


def _compile(model, loss):
    # SGD with momentum, not Adam: Adam would turn rounding noise in a
    # gradient that is zero in exact arithmetic (a bias before a
    # normalization) into steps of the learning rate's size.
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5),
                  loss=loss,
                  metrics=_metrics(loss))


def _batched(*arrays):
    """`arrays` as a dataset of `BATCHES`, in order."""
    parts, start = [], 0
    for size in BATCHES:
        parts.append(tf.data.Dataset.from_tensor_slices(
            tuple(a[start:start + size] for a in arrays)).batch(size))
        start += size
    dataset = parts[0]
    for part in parts[1:]:
        dataset = dataset.concatenate(part)
    return dataset


def _predictions(model, x):
    return keras.ops.convert_to_numpy(model.predict(_batched(x), verbose=0))


def _cases():
    return [pytest.param(name, engine, id=f"{name}-{engine}")
            for name in FAMILIES for engine in ENGINES]


@functools.cache
def _alone(name):
    """What the family's template does alone on one device.

    Its predictions before training and, for a deterministic family, its
    weights and logs after `FIT`. Both engines' cases compare with these:
    the template is trained alone once per family (per test worker).
    """
    _, data, loss, deterministic = FAMILIES[name]
    x, y = data(ROWS)
    reference = _built(name)
    _compile(reference, loss)
    predictions = _predictions(reference, x)
    if not deterministic:
        return predictions, None, None
    history = reference.fit(_batched(x, y), **FIT).history
    return predictions, reference.get_weights(), history


@pytest.mark.zoo(axes=("engine",))
@pytest.mark.parametrize(("name", "engine"), _cases())
def test_a_layer_family_trains_as_on_one_device(name, engine):
    _, data, loss, deterministic = FAMILIES[name]
    x, y = data(ROWS)
    template = _built(name)
    parallel = multigpu.multi_gpu_model(
        template, gpus=DEVICES, engine=engine,
        sync_batchnorm=name == "batch_normalization")
    assert parallel.engine == engine
    # Compiled first: compile drops the traced predict function, which the
    # predictions after training then reuse.
    _compile(parallel, loss)
    predictions, weights, theirs = _alone(name)

    np.testing.assert_allclose(_predictions(parallel, x), predictions,
                               atol=TOL, rtol=TOL)

    before = template.get_weights()
    ours = parallel.fit(_batched(x, y), **FIT).history
    if not deterministic:
        assert np.all(np.isfinite(ours["loss"]))
        assert all(np.all(np.isfinite(w)) for w in template.get_weights())
        assert max(np.abs(w - b).max() for w, b in
                   zip(template.get_weights(), before)) > 1e-4
        np.testing.assert_allclose(_predictions(parallel, x),
                                   _predictions(template, x),
                                   atol=TOL, rtol=TOL)
        return
    for w, r in zip(template.get_weights(), weights):
        np.testing.assert_allclose(w, r, atol=TOL, rtol=TOL)
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], atol=TOL,
                                   rtol=TOL, err_msg=key)
