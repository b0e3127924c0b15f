"""Small model factories shared by the Python tests."""

import keras
import numpy as np


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
