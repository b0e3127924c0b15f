"""What a compiled model was compiled with, made anew for another model.

A model compiled like another (an engine's model like its template, a
one-device reference or baseline like the model it measures) gets objects
of its own: an optimizer serves the variables it was built for, and metrics
hold state. `fresh_optimizer` makes a new optimizer of an optimizer's class
and config; `compile_arguments` makes every `compile` argument of a
compiled model anew.
"""

import keras

from multigpu.messages import literal

# The end of `compile_arguments`' error unless its caller knows a better fix.
REGISTER_METRICS = (
    "Register custom metrics with "
    "keras.saving.register_keras_serializable().")


def fresh_optimizer(optimizer):
    """A new, unbuilt optimizer of `optimizer`'s class and config.

    The hyperparameters are `optimizer`'s (learning rate or its schedule,
    gradient accumulation, a `LossScaleOptimizer`'s inner optimizer); the
    state (step count, moments) starts anew. The new optimizer's variables
    are made in the current scope (a strategy's, a device's).

    Args:
        optimizer: A `keras.optimizers.Optimizer`.

    Returns:
        A new optimizer of the same class.

    Example:
    >>> fresh = fresh_optimizer(model.optimizer)
    >>> int(fresh.iterations.numpy())
    0
    """
    return type(optimizer).from_config(optimizer.get_config())


def compile_arguments(model, fix=REGISTER_METRICS):
    """`compile` arguments that compile another model as `model` was.

    Made anew from `model`'s compile config: new metric objects, a new loss
    object, and an optimizer of the class and config of `model.optimizer`
    (`fresh_optimizer`). A loss the config cannot rebuild (a function Keras
    cannot look up by name) is `model.loss` itself: losses hold no state.
    `jit_compile` is the model's; a caller that runs without XLA drops it.

    Args:
        model: A Keras model.
        fix: The sentence that ends the error: what to do instead.

    Returns:
        A dict of keyword arguments for `compile`, or None when `model` is
        not compiled.

    Raises:
        ValueError: if the metrics in the compile config cannot be rebuilt
            (an unregistered custom metric class), ending with `fix`.

    Example:
    >>> copy.compile(**compile_arguments(model))
    """
    config = model.get_compile_config() if getattr(
        model, "compiled", False) else None
    if not config:
        return None
    config = dict(config)
    loss = config.pop("loss", None)
    # The optimizer is the model's own (below), not the config's entry:
    # its class need not be registered to be made again.
    config.pop("optimizer", None)
    try:
        arguments = dict(keras.saving.deserialize_keras_object(config))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Invalid `model`: the compile configuration of "
            f"{literal(model.name)} cannot be rebuilt ({error}). {fix}"
        ) from None
    try:
        arguments["loss"] = keras.saving.deserialize_keras_object(loss)
    except (TypeError, ValueError):
        arguments["loss"] = model.loss
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        arguments["optimizer"] = fresh_optimizer(optimizer)
    return arguments
