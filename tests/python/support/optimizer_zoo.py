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


def overflowing_batches():
    """The zoo's epoch with rows whose float16 gradients overflow.

    The targets of rows 3 and 8 are 3,000 times the others: row 3 is the
    second device's share of the 4-row batch (2 + 2 rows), row 8 of the
    5-row batch (3 + 2 rows); the 1-row batch stays finite. Under a loss
    scale of 2**15 their gradient overflows float16 in the hidden layer's
    backward pass, while the first device's share stays finite.
    """
    x, y = data()
    y = y.copy()
    y[[3, 8]] *= 3e3
    return Batches(x, y)


def mixed_model():
    """The zoo's model for a mixed policy: its output layer in float32."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((INPUT_DIM,))
    hidden = keras.layers.Dense(6, activation="tanh")(inputs)
    # The output in float32, as Keras's mixed-precision guide advises.
    outputs = keras.layers.Dense(2, dtype="float32")(hidden)
    return keras.Model(inputs, outputs)


def fit_mixed(model):
    """Fits `model` (made under `mixed_float16`) on `overflowing_batches`.

    Returns:
        `(weights, losses, loss scale, updates applied)`.
    """
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    history = model.fit(overflowing_batches(), epochs=3, shuffle=False,
                        verbose=0)
    optimizer = model.optimizer
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    return (model.get_weights(), history.history["loss"],
            float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)),
            int(keras.ops.convert_to_numpy(
                optimizer.inner_optimizer.iterations)))


def check_same_skipped_steps(alone, parallel):
    """Asserts that `fit_mixed`'s two results skipped the same steps."""
    weights, losses, scale, applied = alone
    ours, our_losses, our_scale, our_applied = parallel
    # Some of the 9 steps were skipped (the scale came down from 2**15 and
    # fewer updates were applied) ...
    assert scale < 2.0**15 and 0 < applied < 3 * len(BATCHES)
    # ... the same ones: the same scale and count of updates, and weights
    # that stayed finite.
    assert (our_scale, our_applied) == (scale, applied)
    assert all(np.all(np.isfinite(w)) for w in ours)
    # Within float16's rounding of the forward and backward pass.
    assert max_difference(ours, weights) < 1e-3
    np.testing.assert_allclose(our_losses, losses, rtol=1e-3)


# The mixed-precision runs that move the weights: a model all in float16
# (its outputs too) trained with SGD(0.05) for 3 epochs on 4 devices, in
# batches of 16 rows under the loss scale `compile` adds, and of 12 rows
# under an explicit `LossScaleOptimizer`. name -> (batch size, explicit).
MIXED_RUNS = {"batch16_compile_scale": (16, False),
              "batch12_loss_scale_optimizer": (12, True)}
MIXED_DEVICES = 4
# float16 rounds each step's forward and backward pass: both engines end
# within 3e-4 of one device on these runs (measured 1.2e-4 and 2.0e-4);
# a loss scale that skips a step one device applies ends 0.03-0.1 away.
MIXED_TOL = 2e-3


def float16_model():
    """An MLP made under `mixed_float16`, float16 outputs included."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def fit_float16(model, run):
    """Fits `float16_model()` (or an engine's model of it) for `run`.

    Returns:
        `(weights, loss scale, updates applied)`.
    """
    batch_size, explicit = MIXED_RUNS[run]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 8)).astype("float32")
    # Targets whose scaled gradients stay within float16 on one device.
    y = (0.1 * x @ rng.standard_normal((8, 1)) + 0.1).astype("float32")
    optimizer = keras.optimizers.SGD(0.05)
    if explicit:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=batch_size, epochs=3, shuffle=False,
              verbose=0)
    optimizer = model.optimizer
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    return (model.get_weights(),
            float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)),
            int(keras.ops.convert_to_numpy(
                optimizer.inner_optimizer.iterations)))


def check_float16_as_on_one_device(alone, parallel):
    """Asserts that `fit_float16`'s two results took the same steps."""
    weights, scale, applied = alone
    ours, our_scale, our_applied = parallel
    assert (our_scale, our_applied) == (scale, applied)
    # The weights moved, and as one device moved them.
    assert max_difference(weights, _initial_float16_weights()) > 0.05
    assert max_difference(ours, weights) < MIXED_TOL


def _initial_float16_weights():
    return float16_model().get_weights()
