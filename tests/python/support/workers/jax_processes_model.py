"""The training `jax_processes.py` does, which the test repeats in one process."""

import keras
import numpy as np

import multigpu


def fit_and_predict(gpus, callbacks=(), shuffle_seed=None):
    """Trains `multi_gpu_model(model, gpus)` as every worker does.

    Batches of 8 rows (even on 4 devices), then 3 (fewer rows than devices),
    then 6 and 1 in a second `fit` (uneven, and one row). Shuffled with
    Keras's generator, seeded alike everywhere unless `shuffle_seed` says
    otherwise for the data.

    Returns:
        `(weights, losses, predictions)`.
    """
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(2),
    ])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((19, 5)).astype("float32")
    y = rng.standard_normal((19, 2)).astype("float32")
    parallel = multigpu.multi_gpu_model(model, gpus=gpus)
    parallel.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse",
                     metrics=["mae"])
    if shuffle_seed is not None:
        keras.utils.set_random_seed(shuffle_seed)
    losses = parallel.fit(x, y, batch_size=8, epochs=2, verbose=0,
                          callbacks=list(callbacks)).history["loss"]
    losses += parallel.fit(x, y, batch_size=6, epochs=1, verbose=0,
                           shuffle=False).history["loss"]
    predictions = parallel.predict(x[:7], batch_size=3, verbose=0)
    return model.get_weights(), losses, predictions


def resumable_fit(gpus, epochs, checkpoint_dir=None, callbacks=()):
    """A resumable script's training: restored or built, then checkpointed.

    With `checkpoint_dir`, `make_or_restore_model` and `checkpoint_callbacks`
    there, as a script that outlives its job writes it; without, the
    unbroken run. 22 rows in batches of 6 (6, 6, 6 and 4 rows).

    Returns:
        `(weights, epochs trained by this call)`.
    """
    rng = np.random.default_rng(3)
    x = rng.standard_normal((22, 5)).astype("float32")
    y = rng.standard_normal((22, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((5,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(1),
        ])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        return model

    model = (build() if checkpoint_dir is None
             else multigpu.make_or_restore_model(checkpoint_dir, build))
    parallel = multigpu.multi_gpu_model(model, gpus=gpus)
    parallel.compile(optimizer=model.optimizer, loss="mse")
    callbacks = list(callbacks)
    if checkpoint_dir is not None:
        callbacks += multigpu.checkpoint_callbacks(checkpoint_dir, save_freq=2)
    history = parallel.fit(x, y, batch_size=6, epochs=epochs, shuffle=False,
                           verbose=0, callbacks=callbacks)
    return model.get_weights(), history.epoch
