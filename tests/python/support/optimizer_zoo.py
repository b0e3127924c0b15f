"""The optimizer zoo's cases, shared by the TensorFlow and JAX suites.

Every `keras.optimizers` class, and each option Keras's optimizers take
(gradient clipping three ways, the moving average of the weights, weight
decay, a learning-rate schedule, gradient accumulation, a
`LossScaleOptimizer`), spread over the classes so that every option is
held by several of them and met with accumulation. A case is a
function that makes a new optimizer; `train_alone` and `train_parallel`
train the same tiny model from the same weights on one device and through
`multi_gpu_model`, on an epoch whose batches split evenly, unevenly and
leave a device without rows (`BATCHES` on 2 devices).
"""

import keras
import numpy as np

TOL = 1e-5
DEVICES = 2
# 4 rows split 2/2, 5 rows split 3/2, 1 row leaves a device without rows.
BATCHES = (4, 5, 1)
EPOCHS = 2
INPUT_DIM = 5


def _decay():
    return keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5)


def _multi():
    # The hidden layer's weights with Adam (by their paths), the rest with
    # SGD.
    return keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(
        keras.optimizers.SGD(0.05, momentum=0.5),
        {"hidden/.*": keras.optimizers.Adam(0.01)}))


# name -> a function making a new optimizer. Every class once, each with
# options of its own (named after them; AdamW's weight decay too), so that
# every option meets several classes and gradient accumulation.
CASES = {
    "sgd_clipnorm": lambda: keras.optimizers.SGD(
        0.1, momentum=0.9, nesterov=True, clipnorm=0.05),
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(
        0.05, amsgrad=True, global_clipnorm=0.05),
    "adamw_accumulation": lambda: keras.optimizers.AdamW(
        0.01, weight_decay=0.1, gradient_accumulation_steps=2),
    "adamax_clipvalue_weight_decay": lambda: keras.optimizers.Adamax(
        0.05, clipvalue=0.01, weight_decay=0.05),
    "adagrad_ema": lambda: keras.optimizers.Adagrad(
        0.05, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=3),
    "adadelta_schedule": lambda: keras.optimizers.Adadelta(_decay()),
    "rmsprop_accumulation_schedule": lambda: keras.optimizers.RMSprop(
        _decay(), momentum=0.5, centered=True, gradient_accumulation_steps=2),
    "nadam_accumulation_global_clipnorm": lambda: keras.optimizers.Nadam(
        0.05, global_clipnorm=0.05, gradient_accumulation_steps=3),
    "ftrl_accumulation_clipvalue": lambda: keras.optimizers.Ftrl(
        0.05, l1_regularization_strength=0.01,
        l2_regularization_strength=0.01, clipvalue=0.01,
        gradient_accumulation_steps=2),
    "lion_accumulation_ema": lambda: keras.optimizers.Lion(
        0.005, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=2,
        gradient_accumulation_steps=2),
    "lamb_accumulation_clipnorm": lambda: keras.optimizers.Lamb(
        0.01, clipnorm=0.05, gradient_accumulation_steps=2),
    "adafactor": lambda: keras.optimizers.Adafactor(0.05),
    "muon": lambda: keras.optimizers.Muon(0.01),
    "schedule_free_adamw": lambda: keras.optimizers.ScheduleFreeAdamW(0.01),
    "loss_scale_clipnorm": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, clipnorm=0.05), initial_scale=2.0**8),
    "multi": _multi,
}

def model():
    """The zoo's model: two Dense layers, the same weights every call."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((INPUT_DIM,), name="features")
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))


def data():
    """`(x, y)`: `sum(BATCHES)` rows of a noisy linear regression."""
    rng = np.random.default_rng(11)
    rows = sum(BATCHES)
    x = rng.standard_normal((rows, INPUT_DIM)).astype("float32")
    w = rng.standard_normal((INPUT_DIM, 2)).astype("float32")
    return x, (x @ w + 0.1 * rng.standard_normal((rows, 2))).astype("float32")


class Batches(keras.utils.PyDataset):
    """`(x, y)` in batches of `BATCHES` rows, in order, every epoch."""

    def __init__(self, x, y):
        super().__init__()
        bounds = np.cumsum((0,) + BATCHES)
        self._batches = [(x[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:])]

    def __len__(self):
        return len(self._batches)

    def __getitem__(self, index):
        return self._batches[index]


def fit(model, make_optimizer, build=False):
    """Compiles `model` with a new optimizer and fits it; the loss history.

    Args:
        model: The model.
        make_optimizer: A function of no arguments making the optimizer.
        build: Build the optimizer before `fit` (the engines build it
            themselves).
    """
    model.compile(optimizer=make_optimizer(), loss="mse")
    if build:
        model.optimizer.build(model.trainable_variables)
    x, y = data()
    history = model.fit(Batches(x, y), epochs=EPOCHS, shuffle=False, verbose=0)
    return history.history["loss"]


def train_alone(name):
    """The zoo's model trained on one device: `(weights, losses)`."""
    reference = model()
    # Built before `fit`, as Keras builds it under a strategy and the
    # engines build it. Without one, Keras 3.15 on TensorFlow builds it
    # while tracing the first step, and `ScheduleFreeAdamW.build`'s copy
    # of the weights into its momentum becomes an op of every step (its
    # weights after one step are 0.74 from those of the same model run
    # eagerly).
    losses = fit(reference, CASES[name], build=True)
    return reference.get_weights(), losses


def max_difference(weights, others):
    """The largest absolute difference between two lists of arrays."""
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(weights, others))
