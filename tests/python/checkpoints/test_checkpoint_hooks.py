"""The Keras internals the checkpoint callbacks rely on still do what they need.

`multigpu.internals` names them; each test fails when Keras renames or drops
the private name (the callbacks would otherwise resume at the wrong epoch,
or with other random draws, without an error).
"""

import keras
import numpy as np

from multigpu import internals
from support.models import data, mlp


def _compiled():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_set_initial_epoch_makes_fit_start_there(rng):
    x, y = data(rng, 16)
    model = _compiled()
    internals.set_initial_epoch(model, 2)
    assert internals.initial_epoch(model) == 2
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    assert history.epoch == [2]
    internals.set_initial_epoch(model, None)
    assert model.fit(x, y, batch_size=8, epochs=2, verbose=0).epoch == [0, 1]


def test_the_global_seed_generator_drives_unseeded_draws():
    keras.random.normal((2,))  # creates it
    generator = internals.global_seed_generator()
    assert isinstance(generator, keras.random.SeedGenerator)
    saved = np.asarray(generator.state.numpy())
    first = keras.random.normal((3,)).numpy()
    generator.state.assign(saved)
    np.testing.assert_array_equal(keras.random.normal((3,)).numpy(), first)


class _WrapTrainFunction(keras.callbacks.Callback):
    """Wraps the train function at train begin, as a resumed run does."""

    def on_train_begin(self, logs=None):
        self.calls = 0
        original = self.model.train_function

        def counted(iterator):
            self.calls += 1
            return original(iterator)

        self.model.train_function = counted


def test_fit_runs_the_train_function_set_at_train_begin(rng):
    x, y = data(rng, 32)
    wrap = _WrapTrainFunction()
    _compiled().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[wrap])
    assert wrap.calls == 8
