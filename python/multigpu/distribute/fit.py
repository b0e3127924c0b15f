"""`fit_distributed`: a `fit`-shaped training loop built on `strategy.run`.

Keras 3's `model.fit` fails under `tf.distribute.MultiWorkerMirroredStrategy`
("Attempt to convert a value (PerReplica...) to a Tensor"). This loop runs
the compiled model's training step (its optimizer, loss and metrics) in
every replica with `strategy.run`, reads the metrics aggregated over every
replica of every worker, and drives ordinary Keras callbacks, so it returns
the same `keras.callbacks.History` as `fit`. It works under any strategy:
multi-worker, mirrored, or none. Keras's step is run with each replica's
gradient weighted by its share of the rows
(`multigpu.step.train_step.weighed_by_rows`), so a batch that does not
split evenly between the replicas trains as on one device; a model whose
class has a `train_step` of its own trains by it (the mirrored engine's
weighs the rows itself).
"""

import keras
import numpy as np
import tensorflow as tf

from multigpu import backends, inputs, internals
from multigpu.arguments import check_int
from multigpu.checkpoints.backup import AtomicBackupAndRestore
from multigpu.distribute import strategy as strategy_lib
from multigpu.messages import api, literal, setting
from multigpu.step import train_function as chain
from multigpu.step import train_step as training_step


def _check_model(model):
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `model`: received an object of type "
            f"{type(model).__name__}; expected a compiled keras.Model."
        )
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ValueError(
            f"Invalid `model`: {literal(model.name)} is not compiled. Call "
            "model.compile(optimizer=..., loss=..., metrics=...) inside the "
            "strategy's scope first: fit_distributed trains with the "
            "compiled optimizer, loss and metrics."
        )


def _check_strategy(model, strategy):
    if strategy is None:
        return model.distribute_strategy
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(
            f"Invalid `strategy`: received an object of type "
            f"{type(strategy).__name__}; expected None (the strategy the "
            "model was built under) or a tf.distribute.Strategy."
        )
    return strategy


def _check_variables(model, strategy):
    """Fails early, with the fix, if the model was built outside the scope."""
    outside = [
        v.path for v in model.trainable_variables
        if not strategy.extended.variable_created_in_scope(
            getattr(v, "value", v)
        )
    ]
    if outside:
        raise strategy_lib.StrategyUsageError(
            f"Invalid `model`: its variables {outside[:3]}"
            f"{' ...' if len(outside) > 3 else ''} were not created under the "
            f"scope of the strategy it is trained with "
            f"({type(strategy).__name__}). Build and compile the model inside "
            "`with strategy.scope():` (e.g. with multigpu.make_or_restore_model "
            "or your build function), then call fit_distributed."
        )


def _no_batches_error(where):
    return ValueError(
        f"Invalid `dataset`: {where}, so there is nothing to train on; "
        "expected at least one batch per epoch (check the data's size, "
        f"filters and {setting('drop_remainder', True)} with fewer rows "
        "than one global batch).")


def _distribute(dataset, strategy):
    if isinstance(dataset, tf.distribute.DistributedDataset):
        return dataset, None
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"Invalid `dataset`: received an object of type "
            f"{type(dataset).__name__}; expected a tf.data.Dataset batched at "
            "the global batch size, e.g. "
            f"{api('distributed_dataset', 'x, y, ' + setting('per_replica_batch_size', 64))}."
        )
    steps = int(dataset.cardinality())
    if steps == 0:
        raise _no_batches_error("it is empty")
    steps = steps if steps > 0 else None
    return strategy.experimental_distribute_dataset(dataset), steps


def _logs(model):
    """The model's metrics, aggregated over every replica, as floats."""
    return {
        name: float(np.asarray(value))
        for name, value in model.get_metrics_result().items()
    }


def _build(model, strategy, dataset):
    """Creates the optimizer, metric and loss state before the first step.

    Variables created lazily inside `strategy.run` break the step under a
    multi-replica MirroredStrategy; Keras's `fit` builds them up front from
    the data's shapes in the same way.
    """
    if isinstance(dataset, tf.data.Dataset):
        with strategy.scope():
            internals.symbolic_build(model, dataset.element_spec)
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)


def _replica_step(model):
    """The step every replica runs: the model's own, or Keras's weighing rows.

    A model whose class defines its own `train_step` trains by it. Keras's
    (`keras.Model.train_step`) is run as `training_step.train_step`, which
    weighs each replica's gradient by its share of the rows
    (`training_step.weighed_by_rows`) and calls the model's
    `compute_loss`, its own one included.
    """
    if type(model).train_step is not keras.Model.train_step:
        return model.train_step

    def train_step(data):
        return training_step.train_step(model, data, weigh_rows=True)

    return train_step


def _train_function(model, strategy):
    """A train function over an iterator, as Keras's `model.train_function`.

    Taking the iterator (not the batch) lets the links of the train
    function (`multigpu.step.train_function`) wrap it as they wrap Keras's
    own: the checkpoint callbacks skip, on resume, the batches of the
    interrupted epoch that were already trained.
    """
    replica_step = _replica_step(model)

    @tf.function(reduce_retracing=True)
    def step(batch):
        strategy.run(replica_step, args=(batch,))

    def train_function(iterator):
        step(next(iterator))
        return {}

    return train_function


def _run_epochs(model, data, callbacks, epochs, initial_epoch):
    logs = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        step = -1
        for step, batch in enumerate(data):
            callbacks.on_train_batch_begin(step)
            model.train_function(iter((batch,)))
            logs = _logs(model)
            callbacks.on_train_batch_end(step, logs)
            if model.stop_training:
                break
        if step < 0:
            raise _no_batches_error(f"it yielded no batch in epoch {epoch}")
        callbacks.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            break
    return logs


def _give_data_to_checkpoints(callbacks, dataset):
    """Tells the checkpoint callbacks which dataset they resume.

    `fit` cannot (Keras gives callbacks the model only); here the dataset
    is known, so a seeded `distributed_dataset` is told each epoch without
    `checkpoint_callbacks(..., data=...)`.
    """
    if not isinstance(dataset, tf.data.Dataset):
        return
    for callback in callbacks if isinstance(callbacks, (list, tuple)) else ():
        if isinstance(callback, AtomicBackupAndRestore) and callback.data is None:
            callback.set_data(dataset)


def fit_distributed(model, dataset, epochs=1, strategy=None, verbose="auto",
                    callbacks=None, initial_epoch=0):
    """Trains a compiled model with `strategy.run`; a `fit` for any strategy.

    Every step runs Keras's training step (the compiled optimizer, loss and
    metrics; the model's own `train_step` if its class has one) on each
    replica's share of the global batch; gradients are all-reduced across
    all replicas of all workers, so every worker ends with the same
    weights. Keras's step weighs each replica's gradient by its share of
    the rows (see `multigpu.step.train_step.weighed_by_rows`): a final
    batch that does not split evenly between the replicas trains as on one
    device, where Keras's `fit` under a strategy weights the rows of
    smaller shares more. The model is not changed for the run. Use it
    under `multi_worker_strategy()`, where Keras 3's `model.fit` fails; it
    also works under `mirrored_strategy()` and without a strategy.

    Args:
        model: A `keras.Model` built and compiled under the strategy's scope.
        dataset: A `tf.data.Dataset` batched at the global batch size (see
            `distributed_dataset`), or an already distributed dataset.
        epochs: Index of the last epoch, as in `fit`.
        strategy: The strategy to train under; None for the one the model was
            built under (`model.distribute_strategy`).
        verbose: `"auto"`, 0 (silent), 1 (progress bar) or 2 (one line per
            epoch), as in `fit`. Under multi-worker training, consider
            verbose=0 on all workers but the chief.
        callbacks: Keras callbacks, e.g. `checkpoint_callbacks(...)`
            (BackupAndRestore resumes at the right epoch here as in `fit`).
        initial_epoch: Epoch at which to start, as in `fit`.

    Returns:
        A `keras.callbacks.History`; `history.history["loss"]` holds the
        loss of every epoch averaged over all rows of all workers.

    Raises:
        TypeError: if `model`, `dataset` or `strategy` has the wrong type.
        ValueError: if the model is not compiled or `epochs` is invalid.
        StrategyUsageError: if the model's variables were not created under
            the strategy's scope.

    Example:
    >>> strategy = multigpu.multi_worker_strategy()
    >>> with strategy.scope():
    ...     model = build_and_compile_model()
    >>> data = multigpu.distributed_dataset(x, y, 64, strategy=strategy)
    >>> history = multigpu.fit_distributed(model, data, epochs=3)
    """
    backends.require_backend(
        "fit_distributed", "TensorFlow's tf.distribute, whose strategies run "
        "its training step as TensorFlow graphs")
    _check_model(model)
    epochs = check_int("epochs", epochs, 0)
    initial_epoch = check_int("initial_epoch", initial_epoch, 0)
    strategy = _check_strategy(model, strategy)
    _check_variables(model, strategy)
    inputs.check_batched("dataset", dataset, model)
    data, steps = _distribute(dataset, strategy)
    _build(model, strategy, dataset)
    _give_data_to_checkpoints(callbacks, dataset)
    if verbose == "auto":
        verbose = 1
    callback_list = keras.callbacks.CallbackList(
        callbacks, add_history=True, add_progbar=verbose != 0,
        verbose=verbose, epochs=epochs, steps=steps, model=model,
    )
    model.stop_training = False
    try:
        with chain.based_on(model, _train_function(model, strategy)):
            callback_list.on_train_begin()
            # BackupAndRestore announces the epoch to resume at, as in `fit`.
            initial_epoch = internals.initial_epoch(model) or initial_epoch
            logs = _run_epochs(model, data, callback_list, epochs,
                               initial_epoch)
            callback_list.on_train_end(logs)
    except Exception as error:
        explained = strategy_lib.explain_error(error)
        if explained is None:
            raise
        raise explained from error
    finally:
        internals.set_initial_epoch(model, None)
    return model.history
