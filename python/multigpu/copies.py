"""An engine's copy of a model in memory: new variables, the same graph.

The mirrored engine trains a copy of the template whose variables are
created under a strategy. It copies a model the user built in this
session, trusted code: the copy is not a load from a file and does not
fall under the rules Keras applies to untrusted files (`safe_mode`, which
refuses a `Lambda` layer's Python code). Loading a saved file keeps them.
"""

import keras

from multigpu import internals


def _copy_layer(layer):
    """The copy of one layer of a graph being copied (see `copy_model`)."""
    if isinstance(layer, keras.layers.Lambda):
        # No variables: the copy calls the same layer. Rebuilding it would
        # go through its serialized bytecode, which safe mode refuses and
        # which loses the globals the function reads (`ops` in
        # `lambda x: ops.square(x)`).
        return layer
    if isinstance(layer, keras.Model):
        return copy_model(layer)
    return layer.__class__.from_config(layer.get_config())


def copy_model(model):
    """A copy of `model` with new variables (initial values, not the weights).

    A model whose class has a config of its own (a KerasHub task or
    backbone, a subclassed model) is rebuilt from it, as
    `keras.models.clone_model` does, with its class: a KerasHub causal
    LM's token embedding, which is also its output projection, stays one
    layer. A Sequential or functional model is copied layer by layer
    through its graph, nested models by the same rule; a layer used twice
    stays one layer. `Lambda` layers are shared with `model`, not rebuilt:
    the copy runs the user's function itself, whatever globals it reads.

    Create the copy under the scope (strategy, device) its variables
    belong to, and set its weights from the model's.

    Args:
        model: A built Keras model.

    Returns:
        A new, built Keras model computing what `model` computes.

    Raises:
        ValueError, TypeError, NotImplementedError: as
            `keras.models.clone_model` for a model that cannot be copied
            (a subclassed model without `get_config`: NotImplementedError).

    Example:
    >>> with strategy.scope():
    ...     replica = copy_model(template)
    >>> replica.set_weights(template.get_weights())
    """
    if _has_own_config(model) or not (
            isinstance(model, keras.Sequential) or _is_functional(model)):
        cls = type(model)
        custom_objects = {cls.__name__: cls,
                          keras.saving.get_registered_name(cls): cls}
        # The model is this session's own code: Lambda layers inside a
        # model rebuilt from its config are allowed, as loading a file
        # with `safe_mode=False` allows them.
        config = keras.saving.serialize_keras_object(model)
        # The copy is compiled by its engine, not from the model's config.
        config.pop("compile_config", None)
        return keras.saving.deserialize_keras_object(
            config, custom_objects=custom_objects, safe_mode=False)
    return keras.models.clone_model(model, clone_function=_copy_layer)


def _has_own_config(model):
    """Whether `model`'s class defines `get_config` (Keras's own do not)."""
    module = getattr(type(model).get_config, "__module__", None) or ""
    return not module.startswith("keras.")


def _is_functional(model):
    """Whether `model` is Keras's functional model or a subclass of it."""
    return internals.is_functional(model)
