"""The two trainings `check_equivalence` compares: one device and an engine.

The reference is the model itself trained on one device
(`train_reference`); the other run trains it through an engine of
`multi_gpu_model`, or a copy of it under `mirrored_strategy()`'s scope
with Keras's own `fit` (`train_engine`). Both record the logs of every
step, the weights and the optimizer's state (`Trained`), and leave the
model as it was.
"""

import contextlib
import dataclasses

import keras
import numpy as np

from multigpu import internals, runtime
from multigpu.engines.compiled import compile_arguments
from multigpu.engines.copies import CopyMismatch, copy_in_scope
from multigpu.engines.front import multi_gpu_model
from multigpu.messages import api, setting


def _strategy_copy(model, strategy):
    """`model` copied under `strategy`'s scope, with its weights and state.

    Keras's `fit` under a strategy needs variables made in its scope: the
    copy is the mirrored engine's (`multigpu.engines.copies.copy_in_scope`).

    Raises:
        CopyMismatch: if the copy computes otherwise than `model`.
        ValueError: if `model` cannot be copied, or has a layer written in
            R (`mirrored.check_no_r_code`).
    """
    from multigpu.engines.tensorflow.mirrored import check_no_r_code

    invalid = f"Invalid `model` for {setting('engine', 'strategy')}"
    check_no_r_code(model, invalid)
    return copy_in_scope(
        model, strategy, invalid,
        fix=(f"Build the model inside {api('mirrored_strategy')}'s scope "
             f"rather than copying it, or use {setting('engine', 'replicate')}."),
        uncopyable_fix=("A subclassed model needs `get_config` and "
                        "`from_config` that rebuild it."))


def _stored(variable):
    """A variable's value as stored, as a NumPy array."""
    return np.array(internals.stored_value(variable))


def _on_device(device):
    """A block whose new arrays and steps run on `device` alone."""
    return runtime.of_backend().device_scope(device)


@contextlib.contextmanager
def _put_back(model):
    """Leaves `model` as it was: variables, optimizer, compile state.

    The block may compile and train `model` (the one-device reference, the
    replicate engine's template, the mirrored engine's template compiled
    alongside it). Afterwards every variable of the model and of its
    optimizer holds its value from before, and its attributes (optimizer,
    loss, metrics, compiled functions, the lists Keras tracks them in) are
    the same objects as before: a later `fit` continues the user's
    training.
    """
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables) + list(
        getattr(optimizer, "variables", None) or [])
    values = [_stored(v) for v in variables]
    attributes = dict(model.__dict__)
    # Keras tracks metrics, layers and variables in lists and dicts it
    # keeps as attributes; compiling again appends to them in place.
    # (`type`, not `isinstance`: TensorFlow's tracking proxies pass for
    # dicts without being ones.)
    contents = {key: (list(value) if issubclass(type(value), list)
                      else dict(value))
                for key, value in attributes.items()
                if issubclass(type(value), (list, dict))}
    try:
        yield
    finally:
        model.__dict__.clear()
        model.__dict__.update(attributes)
        for key, saved in contents.items():
            container = attributes[key]
            # The containers' own methods would track the items again.
            if isinstance(container, list):
                list.__setitem__(container, slice(None), saved)
            else:
                dict.clear(container)
                dict.update(container, saved)
        for variable, value in zip(variables, values):
            variable.assign(value)


class _StepLogs(keras.callbacks.Callback):
    """Keeps the logs of every training step."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append({key: float(value)
                           for key, value in (logs or {}).items()})


def _train(model, x, y, batch_size):
    logs = _StepLogs()
    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False,
              verbose=0, callbacks=[logs])
    return logs.steps


@dataclasses.dataclass
class Trained:
    """What one training run left: what `compare` reads.

    Attributes:
        logs: The logs of every step, a list of `{name: float}`.
        weights: The model's weights afterwards (`get_weights()`).
        optimizer_state: The optimizer's variables afterwards, as arrays.
    """

    logs: list
    weights: list
    optimizer_state: list


def _optimizer_state(optimizer):
    """The optimizer's variables as NumPy arrays."""
    return [np.asarray(keras.ops.convert_to_numpy(v))
            for v in optimizer.variables]


def train_reference(model, x, y, batch_size, device):
    """`model` itself trained on `device`, then put back (`_put_back`).

    Args:
        model: The compiled Keras model.
        x: Inputs, `steps * batch_size` rows.
        y: Targets for `x`.
        batch_size: Rows per step.
        device: The one device's canonical name.

    Returns:
        What it `Trained`.

    Example:
    >>> train_reference(model, x, y, 32, "/device:CPU:0").logs[0]["loss"]
    0.71...
    """
    with _put_back(model), _on_device(device):
        model.compile(**compile_arguments(model))
        logs = _train(model, x, y, batch_size)
        return Trained(logs, model.get_weights(),
                        _optimizer_state(model.optimizer))


@dataclasses.dataclass
class EngineRun:
    """What trained through an engine: its name, why, and the result."""

    name: str
    reason: str
    trained: Trained = None
    mismatch: CopyMismatch = None


def train_engine(model, x, y, batch_size, devices, engine,
                  sync_batchnorm=False):
    """`model` trained through `engine` (put back after), or its mismatch.

    A copy the engine makes that computes otherwise (`CopyMismatch`) is a
    finding, not an error: the `EngineRun` holds it and nothing is trained.

    Args:
        model: The compiled Keras model.
        x: Inputs, `steps * batch_size` rows.
        y: Targets for `x`.
        batch_size: Rows per step (the global batch).
        devices: Canonical device names.
        engine: An engine of `multi_gpu_model`, or `"strategy"`.
        sync_batchnorm: The engine's `sync_batchnorm`.

    Returns:
        An `EngineRun`: the engine that ran, why, and what it `Trained`
        (or its copy's mismatch).

    Example:
    >>> train_engine(model, x, y, 32, devices, "auto").name
    'replicate'
    """
    if engine == "strategy":
        from multigpu.distribute import strategy as strategy_lib

        reason = f"Keras's own fit under {api('mirrored_strategy')}"
        strategy = strategy_lib.strategy_over(devices)
        try:
            copy = _strategy_copy(model, strategy)
        except CopyMismatch as mismatch:
            return EngineRun(engine, reason, mismatch=mismatch)
        # The optimizer is made in the scope: its step count is mirrored.
        with strategy.scope():
            copy.compile(**compile_arguments(model))
        logs = _train(copy, x, y, batch_size)
        return EngineRun(engine, reason, Trained(
            logs, copy.get_weights(), _optimizer_state(copy.optimizer)))
    with _put_back(model):
        try:
            parallel = multi_gpu_model(model, gpus=list(devices),
                                       engine=engine,
                                       sync_batchnorm=sync_batchnorm)
        except CopyMismatch as mismatch:
            return EngineRun(engine, f"requested with {setting('engine', engine)}",
                           mismatch=mismatch)
        parallel.compile(**compile_arguments(model))
        logs = _train(parallel, x, y, batch_size)
        return EngineRun(parallel.engine, parallel.engine_reason, Trained(
            logs, model.get_weights(), _optimizer_state(parallel.optimizer)))
