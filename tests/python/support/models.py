"""Small model factories shared by the Python tests."""

import keras
import numpy as np


class RaisesAtSecondBatch(keras.callbacks.Callback):
    """Raises `error` when the second batch of an epoch has trained."""

    def __init__(self, error):
        super().__init__()
        self.error = error

    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            raise self.error


def model_with_r_layer():
    """A model with a layer as keras3 makes one written in R.

    keras3 names the module of such a class `<r-...>`; its `call` would run
    R code through reticulate.
    """

    class RowPenalty(keras.layers.Layer):
        __module__ = "<r-globalenv>"

        def call(self, x):
            return x

    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(2)(RowPenalty(
        name="penalty")(inputs)))


def mlp(input_dim=8, units=16, outputs=3, name="mlp"):
    inputs = keras.Input((input_dim,), name="features")
    hidden = keras.layers.Dense(units, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(outputs, name="scores")(hidden),
                       name=name)


def copy_of(model):
    """An independent model with the same architecture and weights."""
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    return clone


def data(rng, rows, input_dim=8, outputs=3):
    x = rng.standard_normal((rows, input_dim)).astype("float32")
    y = rng.standard_normal((rows, outputs)).astype("float32")
    return x, y


def max_weight_difference(a, b):
    return max(float(np.max(np.abs(u - v)))
               for u, v in zip(a.get_weights(), b.get_weights()))


def pooled_cnn(name="pooled_cnn"):
    """Convolution after MaxPooling: oneDNN fails on zero rows of it."""
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(6, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax", name="label")(x)
    return keras.Model(inputs, outputs, name=name)


def images(rng, rows):
    x = rng.standard_normal((rows, 8, 8, 1)).astype("float32")
    return x, rng.integers(0, 3, size=rows).astype("int32")


# ---------------------------------------------------------------------------
# The zoo of engines/test_shape_zoo.py: one tiny model of every shape the engines must
# treat like the template. Each factory returns a freshly built model.


def zoo_mlp():
    return keras.Sequential(
        [keras.Input((4,))]
        + [keras.layers.Dense(5, activation="tanh", name=f"d{i}")
           for i in range(3)]
        + [keras.layers.Dense(3, name="out")], name="zoo_mlp")


def zoo_cnn():
    """Convolutions with BatchNormalization and Dropout."""
    inputs = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3, padding="same", name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Activation("relu", name="relu")(x)
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Dropout(0.5, name="dropout")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(x),
                       name="zoo_cnn")


def zoo_branching():
    """A stem feeding two branches: a tensor that reaches a stage two ways."""
    inputs = keras.Input((4,), name="features")
    stem = keras.layers.Dense(5, activation="tanh", name="stem")(inputs)
    left = keras.layers.Dense(5, activation="tanh", name="left1")(stem)
    left = keras.layers.Dense(5, activation="tanh", name="left2")(left)
    right = keras.layers.Dense(5, activation="tanh", name="right1")(stem)
    right = keras.layers.Dense(5, activation="tanh", name="right2")(right)
    merged = keras.layers.Concatenate(name="cat")([left, right])
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(merged),
                       name="zoo_branching")


def zoo_residual():
    """Skip connections that span several layers (and so stages)."""
    inputs = keras.Input((4,))
    x0 = keras.layers.Dense(5, activation="tanh", name="stem")(inputs)
    h = keras.layers.Dense(5, activation="tanh", name="h1")(x0)
    h = keras.layers.Dense(5, activation="tanh", name="h2")(h)
    x1 = keras.layers.Add(name="skip1")([x0, h])
    h = keras.layers.Dense(5, activation="tanh", name="h3")(x1)
    h = keras.layers.Dense(5, activation="tanh", name="h4")(h)
    x2 = keras.layers.Add(name="skip2")([x0, x1, h])
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(x2),
                       name="zoo_residual")


def zoo_multi_input():
    a = keras.Input((4,), name="a")
    b = keras.Input((3,), name="b")
    ha = keras.layers.Dense(5, activation="tanh", name="da")(a)
    hb = keras.layers.Dense(5, activation="tanh", name="db")(b)
    merged = keras.layers.Concatenate(name="cat")([ha, hb])
    return keras.Model([a, b], keras.layers.Dense(2, name="out")(merged),
                       name="zoo_multi_input")


def zoo_multi_output():
    """Three outputs, two of them of one shared layer (same name)."""
    inputs = keras.Input((4,))
    h1 = keras.layers.Dense(5, activation="tanh", name="h1")(inputs)
    h2 = keras.layers.Dense(5, activation="tanh", name="h2")(h1)
    head = keras.layers.Dense(2, name="head")
    aux = keras.layers.Dense(1, name="aux")(h1)
    return keras.Model(inputs, [head(h1), aux, head(h2)],
                       name="zoo_multi_output")


def zoo_siamese():
    """The siamese model of tf.keras's multi_gpu_model tests."""
    nested = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                               keras.layers.Dense(1)], name="nested")
    i1, i2 = keras.Input((3,)), keras.Input((3,))
    s1, s2 = nested(i1), nested(i2)
    return keras.Model([i1, i2], [keras.layers.Add(name="add")([s1, s2]),
                                  s1, s2], name="zoo_siamese")


def zoo_nested():
    """A functional model inside a Sequential inside a functional model."""
    inner_in = keras.Input((5,))
    inner = keras.Model(
        inner_in, keras.layers.Dense(5, activation="tanh", name="i1")(inner_in),
        name="inner")
    block = keras.Sequential([keras.Input((5,)), inner,
                              keras.layers.Dense(4, name="b1")], name="block")
    inputs = keras.Input((4,))
    x = keras.layers.Dense(5, activation="tanh", name="pre")(inputs)
    x = block(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(x),
                       name="zoo_nested")


def zoo_rnn_state():
    """A GRU whose initial state is a second input."""
    sequence = keras.Input((5, 3), name="sequence")
    state = keras.Input((4,), name="state")
    x = keras.layers.Dense(4, name="embed")(sequence)
    x = keras.layers.GRU(4, name="gru")(x, initial_state=[state])
    return keras.Model([sequence, state], keras.layers.Dense(2, name="out")(x),
                       name="zoo_rnn_state")


def zoo_embedding_lstm():
    tokens = keras.Input((6,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(10, 4, name="embedding")(tokens)
    x = keras.layers.LSTM(4, name="lstm")(x)
    return keras.Model(tokens, keras.layers.Dense(2, name="out")(x),
                       name="zoo_embedding_lstm")


@keras.saving.register_keras_serializable(package="multigpu_tests")
class ZooSubclassed(keras.Model):
    """A subclassed model: its call() is code, not a graph of layers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(5, activation="tanh")
        self.out = keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.hidden(x) + x[:, :1])


def zoo_subclassed():
    model = ZooSubclassed(name="zoo_subclassed")
    model(np.zeros((1, 4), "float32"))
    return model


def zoo_application():
    """keras.applications.MobileNet, as small as it gets."""
    return keras.applications.MobileNet(
        input_shape=(32, 32, 3), alpha=0.25, depth_multiplier=1,
        weights=None, classes=3, dropout=0.0, name="zoo_application")


def zoo_mixed_float16():
    """An MLP under the mixed_float16 policy, float32 outputs."""
    return keras.Sequential(
        [keras.Input((4,))]
        + [keras.layers.Dense(8, activation="tanh", dtype="mixed_float16",
                              name=f"d{i}") for i in range(3)]
        + [keras.layers.Dense(2, dtype="float32", name="out")],
        name="zoo_mixed_float16")


ZOO = {
    "mlp": zoo_mlp,
    "cnn": zoo_cnn,
    "branching": zoo_branching,
    "residual": zoo_residual,
    "multi_input": zoo_multi_input,
    "multi_output": zoo_multi_output,
    "siamese": zoo_siamese,
    "nested": zoo_nested,
    "rnn_state": zoo_rnn_state,
    "embedding_lstm": zoo_embedding_lstm,
    "subclassed": zoo_subclassed,
    "application": zoo_application,
    "mixed_float16": zoo_mixed_float16,
}


def _graph_input_specs(model):
    graph = getattr(model, "_functional", None) or model
    try:
        return [(tuple(t.shape[1:]), t.dtype) for t in graph.inputs]
    except (AttributeError, ValueError):  # subclassed
        shape = model.get_build_config()["input_shape"]
        return [(tuple(shape[1:]), "float32")]


def zoo_batch(model, rng, rows):
    """Inputs and targets (one per output) of `rows` rows for `model`."""
    xs = []
    for shape, dtype in _graph_input_specs(model):
        if "int" in str(dtype):
            xs.append(rng.integers(0, 10, size=(rows,) + shape).astype(dtype))
        else:
            xs.append(rng.standard_normal((rows,) + shape).astype("float32"))
    outputs = keras.tree.flatten(model.compute_output_spec(
        [keras.KerasTensor((None,) + s, d)
         for s, d in _graph_input_specs(model)]
        if len(xs) > 1 else
        keras.KerasTensor((None,) + _graph_input_specs(model)[0][0],
                          _graph_input_specs(model)[0][1])))
    ys = [rng.standard_normal((rows,) + tuple(o.shape[1:])).astype("float32")
          for o in outputs]
    return (xs if len(xs) > 1 else xs[0]), (ys if len(ys) > 1 else ys[0])


def normalized_mlp():
    """A small model with BatchNormalization, whose batch statistics a split across devices must pool."""
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    hidden = keras.layers.BatchNormalization(name="norm")(hidden)
    outputs = keras.layers.Dense(3, name="scores")(hidden)
    return keras.Model(inputs, outputs, name="normalized_mlp")
