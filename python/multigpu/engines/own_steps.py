"""Models that bring their own training logic, which the engines refuse.

A Keras model's class may override the steps `fit`, `evaluate` and
`predict` run, or the loss and metrics those steps compute (keras.io,
"Customizing what happens in fit()"): GANs, VAEs and custom losses are
written so. The engines train a model of their own around the template
(`ParallelModel`, `MirroredModel`, `PartitionedModel`), whose steps are
Keras's standard ones spread over devices; they cannot run the template's
class's methods in their place, so they refuse such a model, naming the
methods, rather than train it with other mathematics and no word. Keras's
own `fit` under a `tf.distribute.MirroredStrategy` scope runs the model's
steps on every replica.
"""

import keras

from multigpu.messages import api, current_language, literal

# The methods of `keras.Model` that decide what a step computes.
STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss",
                "compute_metrics")


def overridden_steps(model):
    """The methods of `STEP_METHODS` that `model`'s class defines anew.

    Args:
        model: A Keras model.

    Returns:
        A list of method names, in `STEP_METHODS` order; empty for a
        Sequential, functional or KerasHub model.

    Example:
    >>> class Gan(keras.Model):
    ...     def train_step(self, data): ...
    >>> overridden_steps(Gan(...))
    ['train_step']
    """
    cls = type(model)
    return [name for name in STEP_METHODS
            if getattr(cls, name, None) is not getattr(keras.Model, name)]


def _strategy_scope():
    """How a user builds a model in a mirrored strategy's scope."""
    if current_language() == "r":
        return (f"`with({api('mirrored_strategy')}$scope(), {{...}})` and "
                "its own fit()")
    return (f"`with {api('mirrored_strategy')}.scope():` and its own "
            "fit()")


def check_standard_steps(model, call):
    """Refuses a model whose class overrides a step method.

    Args:
        model: The Keras model given to `call`.
        call: The function refusing it, e.g. `"multi_gpu_model"`.

    Raises:
        ValueError: naming the overridden methods and what runs them.

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
        "train the model without them. Build and compile the model in a "
        f"mirrored strategy's scope instead ({_strategy_scope()}): Keras "
        "then runs the model's own steps on every device."
    )
