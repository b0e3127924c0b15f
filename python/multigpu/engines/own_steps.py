"""Models that bring their own training logic, which the engines refuse.

A Keras model's class may override the steps `fit`, `evaluate` and
`predict` run, or the loss and metrics those steps compute (keras.io,
"Customizing what happens in fit()"): GANs, VAEs and custom losses are
written so. On JAX, Keras's trainer takes the loss and its gradient from
hooks of its own (`compute_loss_and_updates`, `stateless_compute_loss`),
which a model may override too. The engines train a model of their own
around the template (`ParallelModel`, `MirroredModel`, `PartitionedModel`,
`ShardedModel`), whose steps are Keras's standard ones spread over
devices; they cannot run the template's class's methods in their place, so
they refuse such a model, naming the methods, rather than train it with
other mathematics and no word. Keras's own `fit` under a
`tf.distribute.MirroredStrategy` scope (on JAX, under
`keras.distribution.DataParallel`) runs the model's steps on every
replica.
"""

import keras

from multigpu.messages import api, current_language, literal

# The methods of `keras.Model` that decide what a step computes, on every
# backend.
STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss",
                "compute_metrics")

# The hooks only one backend's trainer calls, by backend: Keras's JAX
# trainer's `train_step` and `test_step` take the loss (scaled for a
# LossScaleOptimizer) from `compute_loss_and_updates`, which takes it from
# `stateless_compute_loss`. `keras.Model` has `stateless_compute_loss` on
# every backend, but only the JAX trainer calls it: overriding it on
# TensorFlow changes no step, the template's on one device included.
BACKEND_STEP_METHODS = {
    "jax": ("compute_loss_and_updates", "stateless_compute_loss"),
}


def step_methods():
    """The methods a model may override to change what a step computes.

    Returns:
        `STEP_METHODS`, then the hooks of `BACKEND_STEP_METHODS` for the
        backend Keras runs on that `keras.Model` has there.

    Example:
    >>> step_methods()[-2:]   # on the JAX backend
    ('compute_loss_and_updates', 'stateless_compute_loss')
    """
    own = BACKEND_STEP_METHODS.get(keras.backend.backend(), ())
    return STEP_METHODS + tuple(name for name in own
                                if hasattr(keras.Model, name))


def overridden_steps(model):
    """The methods of `step_methods()` that `model`'s class defines anew.

    Args:
        model: A Keras model.

    Returns:
        A list of method names, in `step_methods()` order; empty for a
        Sequential, functional or KerasHub model.

    Example:
    >>> class Gan(keras.Model):
    ...     def train_step(self, data): ...
    >>> overridden_steps(Gan(...))
    ['train_step']
    """
    cls = type(model)
    return [name for name in step_methods()
            if getattr(cls, name, None) is not getattr(keras.Model, name)]


def _strategy_scope():
    """How a user builds a model in a mirrored strategy's scope."""
    if current_language() == "r":
        return (f"`with({api('mirrored_strategy')}$scope(), {{...}})` and "
                "its own fit()")
    return (f"`with {api('mirrored_strategy')}.scope():` and its own "
            "fit()")


def _jax_advice():
    """What runs a model's own steps on every device, on JAX."""
    prefix = "keras$distribution$" if current_language() == "r" else (
        "keras.distribution.")
    call = f"`{prefix}set_distribution({prefix}DataParallel())`"
    return (f"Set Keras's distribution before building the model "
            f"instead ({call}) and train it with its own fit(): Keras "
            "then runs the model's own steps on every device (each "
            "batch's rows must divide evenly between the devices).")


def _tensorflow_advice():
    """What runs a model's own steps on every device, on TensorFlow."""
    return ("Build and compile the model in a mirrored strategy's scope "
            f"instead ({_strategy_scope()}): Keras then runs the model's "
            "own steps on every device.")


# What to advise, by the backend that runs (the callers have refused the
# others with `backends.check_supported`).
_ADVICE = {"tensorflow": _tensorflow_advice, "jax": _jax_advice}


def _advice():
    """What runs a model's own steps on every device, on this backend."""
    return _ADVICE[keras.backend.backend()]()


def check_standard_steps(model, call):
    """Refuses a model whose class overrides a step method.

    Args:
        model: The Keras model given to `call`.
        call: The function refusing it, e.g. `"multi_gpu_model"`.

    Raises:
        ValueError: naming the overridden methods, what runs them and, for
            the backend Keras runs on, what would.

    Example:
    >>> check_standard_steps(model, "multi_gpu_model")
    """
    methods = overridden_steps(model)
    if not methods:
        return
    names = ", ".join(f"`{name}`" for name in methods)
    raise ValueError(
        f"Invalid `model`: {literal(model.name)} is a "
        f"{type(model).__name__}, whose class defines its own {names}. "
        f"{api(call)} runs Keras's standard steps on the devices and would "
        f"train the model without them. {_advice()}"
    )
