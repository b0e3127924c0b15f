"""Model recipes and data for the shared scenarios, defined once for both runners.

The Python runner imports this module; the R runner loads it with
`reticulate::import_from_path("recipes", "tests/scenarios")`. Building a
model or generating data here is not the API under test (multigpu's
functions and the Keras model methods, called through each language's own
API, are): it only guarantees that both languages start from the same
initial weights and the same numbers.

Every recipe is seeded with `keras.utils.set_random_seed(seed)` immediately
before its layers are created, and its random weights are then drawn again
by numpy from the same seed (`_backend_free_weights`): Keras's initializers
draw other numbers on TensorFlow than on JAX, and the same (recipe, seed)
must give the same initial weights in either language, on either backend
and in any order of scenarios.
"""

import keras
import numpy as np


def _mlp(input_dim=6, units=8, outputs=3):
    inputs = keras.Input((input_dim,), name="features")
    hidden = keras.layers.Dense(units, activation="tanh", name="hidden")(inputs)
    outputs = keras.layers.Dense(outputs, name="scores")(hidden)
    return keras.Model(inputs, outputs, name="mlp")


def _cnn(side=8, filters=4, classes=3):
    return keras.Sequential([
        keras.Input((side, side, 1), name="image"),
        keras.layers.Conv2D(filters, 3, activation="relu", name="conv"),
        keras.layers.MaxPooling2D(2, name="pool"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(classes, activation="softmax", name="probs"),
    ], name="cnn")


def _two_io():
    a = keras.Input((5,), name="a")
    b = keras.Input((3,), name="b")
    joined = keras.layers.Concatenate(name="join")([a, b])
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(joined)
    reg = keras.layers.Dense(1, name="reg")(hidden)
    cls = keras.layers.Dense(3, activation="softmax", name="cls")(hidden)
    return keras.Model([a, b], [reg, cls], name="two_io")


def _shared_submodel():
    inner = keras.Input((4,), name="inner_in")
    encoded = keras.layers.Dense(5, activation="tanh", name="enc")(inner)
    encoder = keras.Model(inner, encoded, name="encoder")
    left = keras.Input((4,), name="left")
    right = keras.Input((4,), name="right")
    joined = keras.layers.Concatenate(name="join")([encoder(left),
                                                    encoder(right)])
    return keras.Model([left, right], keras.layers.Dense(1, name="score")(joined),
                       name="siamese")


def _batchnorm():
    return keras.Sequential([
        keras.Input((6,), name="features"),
        keras.layers.Dense(8, name="dense"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Activation("relu", name="relu"),
        keras.layers.Dense(2, name="out"),
    ], name="bn_mlp")


def _rnn(steps=5, features=3, units=6, outputs=2):
    return keras.Sequential([
        keras.Input((steps, features), name="sequence"),
        keras.layers.GRU(units, name="gru"),
        keras.layers.Dense(outputs, name="out"),
    ], name="rnn")


def _fixed_batch():
    inputs = keras.Input(batch_shape=(8, 6), name="features")
    return keras.Model(inputs, keras.layers.Dense(3, name="scores")(inputs),
                       name="fixed_batch")


def _one_layer():
    """One Dense layer: nothing for model parallelism to cut."""
    inputs = keras.Input((6,), name="features")
    return keras.Model(inputs, keras.layers.Dense(3, name="scores")(inputs),
                       name="one_layer")


def _not_a_model():
    layer = keras.layers.Dense(3, name="lonely_dense")
    layer.build((None, 6))
    return layer
def _siamese_outputs():
    """tf.keras's siamese test: the shared model's output is two outputs."""
    nested = keras.Sequential([keras.Input((3,), name="nested_in"),
                               keras.layers.Dense(6, name="n1"),
                               keras.layers.Dense(1, name="n2")],
                              name="nested")
    left = keras.Input((3,), name="left")
    right = keras.Input((3,), name="right")
    s1, s2 = nested(left), nested(right)
    added = keras.layers.Add(name="add")([s1, s2])
    return keras.Model([left, right], [added, s1, s2], name="siamese_outputs")


def _branching():
    """A stem feeding two branches, merged, then a head."""
    inputs = keras.Input((6,), name="features")
    stem = keras.layers.Dense(8, activation="tanh", name="stem")(inputs)
    left = keras.layers.Dense(8, activation="tanh", name="left1")(stem)
    left = keras.layers.Dense(8, activation="tanh", name="left2")(left)
    right = keras.layers.Dense(8, activation="tanh", name="right1")(stem)
    right = keras.layers.Dense(8, activation="tanh", name="right2")(right)
    merged = keras.layers.Concatenate(name="cat")([left, right])
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(merged),
                       name="branching")


RECIPES = {
    "mlp": _mlp,
    "cnn": _cnn,
    "two_io": _two_io,
    "shared_submodel": _shared_submodel,
    "batchnorm": _batchnorm,
    "rnn": _rnn,
    "siamese_outputs": _siamese_outputs,
    "branching": _branching,
    "fixed_batch": _fixed_batch,
    "not_a_model": _not_a_model,
    "one_layer": _one_layer,
}


def build(recipe, seed):
    """A freshly built model of `recipe`, its weights drawn from `seed`."""
    if recipe not in RECIPES:
        raise KeyError(f"Unknown recipe {recipe!r}; known: {sorted(RECIPES)}")
    keras.utils.set_random_seed(int(seed))
    model = RECIPES[recipe]()
    _backend_free_weights(model, seed)
    return model


def _backend_free_weights(model, seed):
    """Draws `model`'s random weights with numpy from `seed`.

    A weight whose initializer is a constant (zero biases and BatchNormalization's
    beta and moving mean, its gamma and moving variance of ones) keeps it,
    on every backend alike; every other weight is drawn uniformly over
    Glorot's range for its shape, Keras's default kernel initializer.
    """
    rng = np.random.default_rng(int(seed))
    weights = []
    for weight in model.get_weights():
        if weight.size == 0 or np.all(weight == weight.flat[0]):
            weights.append(weight)
            continue
        limit = np.sqrt(6.0 / sum(_fans(weight.shape)))
        weights.append(rng.uniform(-limit, limit, weight.shape).astype(
            weight.dtype))
    model.set_weights(weights)


def _fans(shape):
    """(fan in, fan out) of a weight of `shape`, as Keras's initializers count them."""
    if len(shape) < 2:
        return (shape[0], shape[0]) if shape else (1, 1)
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


def _features(rng, rows, *shape):
    return rng.standard_normal((rows,) + shape).astype("float32")


def _labels(rng, rows, classes=3):
    return rng.integers(0, classes, size=rows).astype("int32")


def make_data(recipe, seed, rows):
    """`{"x": inputs, "y": targets}` for `recipe`, drawn from `seed`.

    Inputs of multi-input models are a dict keyed by input name (a named
    list in R); targets of multi-output models a dict keyed by output name.
    Float data is float32, class labels int32 (an R integer vector), so the
    numbers are exactly the same in both languages.
    """
    rng = np.random.default_rng(int(seed))
    rows = int(rows)
    if recipe in ("mlp", "fixed_batch", "not_a_model", "one_layer"):
        x = _features(rng, rows, 6)
        y = (np.tanh(x[:, :3]) + 0.1 * _features(rng, rows, 3)).astype("float32")
    elif recipe == "cnn":
        x = _features(rng, rows, 8, 8, 1)
        y = _labels(rng, rows)
    elif recipe == "two_io":
        a, b = _features(rng, rows, 5), _features(rng, rows, 3)
        x = {"a": a, "b": b}
        y = {"reg": (a[:, :1] - b[:, :1]).astype("float32"),
             "cls": _labels(rng, rows)}
    elif recipe == "shared_submodel":
        left, right = _features(rng, rows, 4), _features(rng, rows, 4)
        x = {"left": left, "right": right}
        y = np.sum(left * right, axis=1, keepdims=True).astype("float32")
    elif recipe == "batchnorm":
        x = _features(rng, rows, 6) * 3.0 + 1.0
        y = np.stack([x[:, 0] - x[:, 1], x[:, 2]], axis=1).astype("float32")
    elif recipe == "rnn":
        x = _features(rng, rows, 5, 3)
        y = np.stack([x[:, :, 0].mean(axis=1), x[:, -1, 1]],
                     axis=1).astype("float32")
    elif recipe == "siamese_outputs":
        left, right = _features(rng, rows, 3), _features(rng, rows, 3)
        x = {"left": left, "right": right}
        # One target per output, by position: the template names two of its
        # outputs "nested", the parallel model "nested" and "nested_1".
        y = [(left[:, :1] + right[:, :1]).astype("float32"),
             left[:, 1:2].copy(), right[:, 1:2].copy()]
    elif recipe == "branching":
        x = _features(rng, rows, 6)
        y = np.stack([x[:, 0] * x[:, 1], np.tanh(x[:, 2])],
                     axis=1).astype("float32")
    else:
        raise KeyError(f"No data for recipe {recipe!r}")
    return {"x": x, "y": y}


# The parity check of tests/python/test_scenario_parity_keras3.py embeds R in the pytest
# process: the R runner (tests/testthat/helper-scenarios.R) is set here as
# R_RUNNER, a Python callable, and stores each record in R_RECORDS, keyed by
# scenario name.
R_RUNNER = None
R_RECORDS = {}


def store_r_record(name, record):
    R_RECORDS[name] = record
