"""The Keras internals this package relies on, in one place, on every backend.

Each function reads or writes one private attribute, or imports one private
module (`keras.src...`), for which Keras 3.15 has no public equivalent.
Everything else in the package goes through these functions, so a Keras
upgrade that renames one breaks this module only (ruff's SLF001 is off here
and in `tensorflow_internals`, on everywhere else;
`tests/python/test_layout.py` refuses private imports elsewhere).
TensorFlow's internals are in `multigpu.tensorflow_internals`: this module
imports no TensorFlow, so that Keras on JAX runs without it.
"""

import sys


def producing_operation(tensor):
    """The layer or operation whose call made a symbolic Keras tensor.

    Example:
    >>> producing_operation(model.output).name
    'dense_1'
    """
    return tensor._keras_history.operation


def logits_of(tensor):
    """The logits Keras attached to a softmax or sigmoid output, or None.

    Keras's cross-entropy losses read them instead of the probabilities:
    exact and stable where log(clip(p)) is not.
    """
    return getattr(tensor, "_keras_logits", None)


def attach_logits(tensor, logits):
    """Attaches `logits` to `tensor`, as Keras's softmax and sigmoid do.

    Raises:
        AttributeError: for eager tensors, which take no attributes.
    """
    tensor._keras_logits = logits


def nodes_by_depth(graph):
    """A functional graph's nodes, `{depth: [node, ...]}` (outputs at 0)."""
    return graph._nodes_by_depth


def symbolic_build(model, data_batch):
    """Creates `model`'s compiled state (metrics, loss) from a batch's specs.

    What Keras's `fit` does before its first step.
    """
    model._symbolic_build(data_batch=data_batch)


def initial_epoch(model):
    """The epoch `BackupAndRestore` (or a resumed run) asks `fit` to start at."""
    return model._initial_epoch


def set_initial_epoch(model, epoch):
    """Asks `fit` to start at `epoch` (None: as given to `fit`)."""
    model._initial_epoch = epoch


def dataset_inputs(dataset):
    """The datasets a `tf.data.Dataset` reads from (none for a source).

    Raises:
        AttributeError, TypeError: for objects that are not datasets.
    """
    return dataset._inputs()


def functional_graph_of(model):
    """The functional graph Keras keeps inside a Sequential model, or None."""
    return getattr(model, "_functional", None)


def nested_layers(layer):
    """The layers inside `layer` (a nested model or layer), at any depth."""
    flatten = getattr(layer, "_flatten_layers", None)
    return list(flatten(include_self=False)) if flatten else []


def loss_tracker(model):
    """The `keras.metrics.Mean` that reports a compiled model's `loss`.

    Keras's `train_step` updates it; the engines' own step
    (`multigpu.step.train_step`) does the same.
    """
    return model._loss_tracker


def keras_mask(tensor):
    """The Keras mask a symbolic tensor carries (Embedding(mask_zero), ...)."""
    return getattr(tensor, "_keras_mask", None)


def takes_training_argument(operation):
    """Whether a layer's `call` takes Keras's `training` argument."""
    return "training" in getattr(operation, "_call_context_args", ())


def reshuffles_each_iteration(dataset):
    """Whether a `Dataset.shuffle` dataset draws a new order every epoch."""
    return bool(getattr(dataset, "_reshuffle_each_iteration", False))


def validates_for_fit(evaluate_arguments):
    """Whether an `evaluate` call is Keras's `fit` validating (by name).

    `fit` runs its validation as `evaluate(..., _use_cached_eval_dataset=True)`.
    """
    return bool(evaluate_arguments.get("_use_cached_eval_dataset"))


# The checkpoint callbacks' hook (`multigpu.checkpoints`): the random state
# Keras saves with no model.


def global_seed_generator():
    """The `keras.random.SeedGenerator` of unseeded `keras.random` calls, or None.

    Keras keeps it in its global state (created by the first unseeded draw)
    and saves it with no model; a resumed run restores its state.
    """
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("global_seed_generator")


# The engines' hooks: the copy of an in-memory model (`multigpu.engines.copies`) and
# the memory plan (`multigpu.insight.memory_plan`).


def is_functional(model):
    """Whether `model` is Keras's functional model (its class is private).

    A subclassed model called on symbolic inputs has `inputs` too, but no
    graph of layers: its `call` is code.
    """
    from keras.src.models.functional import Functional

    return isinstance(model, Functional)


def batch_norm_reduction_axes(layer):
    """The axes a built BatchNormalization layer takes its moments over."""
    return list(layer._reduction_axes)


def replace_moments(layer, moments):
    """Makes a BatchNormalization layer take its moments from `moments`.

    `moments(inputs, mask)` returns `(mean, variance)` as the layer's own
    `_moments` does; the layer's `call` still normalises and updates its
    moving statistics with them.
    """
    layer._moments = moments


# The guarded step's stateless forward pass (`multigpu.step.stateless`).


def stateless_scope():
    """The `keras.StatelessScope` being traced in (Keras keeps it per thread)."""
    from keras.src.backend.common import stateless_scope

    return stateless_scope.get_stateless_scope()


def stored_value(variable):
    """A Keras variable's value as stored: no stateless scope, no autocast.

    On TensorFlow the stored value is a `tf.Variable`, read here into a
    tensor as `tf.convert_to_tensor` reads it (on the variable's device:
    `read_value` would add an identity in the caller's device scope, a
    copy across devices); on JAX it is an array already.
    """
    value = variable._value
    tf = sys.modules.get("tensorflow")  # a tf.Variable exists only then
    if tf is not None and isinstance(value, tf.Variable):
        return tf.convert_to_tensor(value)
    return value


# A failed `fit`'s input iterators (`multigpu.engines.tensorflow.trainer.TensorFlowTrainer.fit`).


def release_iterator(iterator):
    """Frees the tf.data iterators inside a `fit`'s input iterator now.

    When `fit` raises, Keras's epoch iterator stays in a reference cycle
    (its suspended generator refers back to it) and in the frames of the
    error, and with it the iterator it passed to the train function: a
    `tf.distribute` `DistributedIterator` (its workers' multi-device
    iterator and one iterator per device) or a `tf.data` iterator. Freed
    later by a garbage collection, an aged tf.data iterator can wait up to
    a minute for its autotuning thread (docs/tf-data-stall.md). The Python objects
    stay where they are, emptied: they are never iterated again.

    Args:
        iterator: What Keras passed to `model.train_function`.
    """
    workers = getattr(iterator, "_iterators", None)
    if isinstance(workers, list):  # tf.distribute's DistributedIterator
        for worker in workers:
            _release_owned(getattr(worker, "_iterator", None))
            worker._iterator = None
        iterator._iterators = []
    else:
        _release_owned(iterator)


def _release_owned(iterator):
    devices = getattr(iterator, "_device_iterators", None)
    if isinstance(devices, list):  # OwnedMultiDeviceIterator
        for device_iterator in devices:
            _release_owned(device_iterator)
        iterator._device_iterators = []
        iterator._multi_device_iterator_resource = None
    elif hasattr(iterator, "_iterator_resource"):  # tf.data's OwnedIterator
        iterator._iterator_resource = None


def drop_cached_evaluation(model):
    """Frees the validation iterator a failed `fit` left on `model`.

    Keras's `fit` caches its validation data's epoch iterator on the model
    and deletes it only when it returns; the next `fit` would free it.
    """
    if getattr(model, "_eval_epoch_iterator", None) is not None:
        model._eval_epoch_iterator = None


def initialized(variable):
    """Whether a Keras variable holds a value.

    A variable created inside a stateless scope gets its value only when
    the scope ends.
    """
    return variable._value is not None


# Attributes kept out of Keras's and TensorFlow's tracking: one mechanism
# for every engine (`multigpu.engines`).


def set_untracked(obj, name, value):
    """Sets `obj.<name>` to `value` out of sight of Keras's and TensorFlow's tracking.

    A Keras layer or model tracks what its attributes are set to: a layer
    becomes one of its layers, a variable one of its weights, a list a
    tracked list. Keras 3.15 switches that off in the private
    `keras.src.utils.tracking.DotNotTrackScope`. On TensorFlow a trackable
    also becomes a checkpoint dependency of the model, which TensorFlow
    2.21 switches off per object with
    `tf.__internal__.tracking.no_automatic_dependency_tracking`. An
    attribute set here is neither: use it for a reference to another
    model (a template) and for state that is not the model's (a gradient
    accumulator's or the NaN guard's variables). Other objects take the
    value as any attribute.

    Args:
        obj: A Keras layer or model, or any object.
        name: The attribute's name.
        value: Its value.

    Returns:
        `value`.

    Example:
    >>> set_untracked(model, "_template", template)
    >>> template in model.layers
    False
    """
    from keras.src.utils import tracking

    with tracking.DotNotTrackScope():
        # A TensorFlow trackable exists only once TensorFlow is imported.
        if sys.modules.get("tensorflow") is not None:
            from multigpu import tensorflow_internals

            if tensorflow_internals.set_without_dependency(obj, name, value):
                return value
        setattr(obj, name, value)
    return value


def untracked(obj, name, make=None):
    """`obj`'s attribute `name`, as `set_untracked` set it.

    Args:
        obj: The object.
        name: The attribute's name.
        make: Called when `obj` has no such attribute yet; its result is
            set with `set_untracked` and returned. Without it the answer
            is then None.

    Returns:
        The attribute's value, or what `make()` made, or None.

    Example:
    >>> untracked(model, "_parts", make=lambda: [keras.Variable(0.0)])
    [<Variable ...>]
    """
    try:
        return getattr(obj, name)
    except AttributeError:
        return None if make is None else set_untracked(obj, name, make())


# The mirrored engine's hooks (`multigpu.engines.tensorflow.mirrored`).


def metrics_in_order(model, logs):
    """`logs` as a `*_on_batch` call returns them without `return_dict`.

    One value, or a list in the order of the model's metrics (the rest by
    name): what Keras 3.15's `train_on_batch` returns, through the private
    `Trainer._flatten_metrics_in_order`.

    Args:
        model: The compiled model the logs are of.
        logs: `{name: value}` of one step.

    Returns:
        A scalar or a list of scalars.
    """
    return model._flatten_metrics_in_order(logs)


# Saving's hook (`multigpu.saving`).


def optimizer_weights_from_hdf5(h5):
    """The optimizer's weights a legacy `.h5` model file holds, in order.

    Keras 3.15 reads them only in its private legacy loader
    (`keras.src.legacy.saving.legacy_h5_format`); no public function
    returns them.

    Args:
        h5: An open `h5py.File` with an `optimizer_weights` group.

    Returns:
        A list of numpy arrays, for `optimizer.set_weights`.
    """
    from keras.src.legacy.saving import legacy_h5_format

    return legacy_h5_format.load_optimizer_weights_from_hdf5_group(h5)


# The order of the parts of Keras's JAX trainer state (`_get_jax_state`).
_JAX_STATE_PARTS = ("trainable_variables", "non_trainable_variables",
                    "optimizer_variables", "metrics_variables")


def hold_jax_state(model, state):
    """Makes `state` the JAX trainer's latest state, synced back at `fit`'s end.

    Keras's JAX `fit` takes the variables' values out of the model at each
    epoch's start and puts the latest state back when it ends, but a call
    of the train function that fails before any step of the epoch leaves
    no state to put back: the model's variables would stay empty.

    Args:
        model: A `keras.Model` on JAX, inside `fit`.
        state: The `(trainable, non_trainable, optimizer, metrics)` values
            the train function was given.
    """
    model._jax_state = dict(zip(_JAX_STATE_PARTS, state))
    model._jax_state_synced = False


def set_variable_layout(variable, layout):
    """Gives a Keras variable on JAX a layout, and moves its value there.

    Keras reads a variable's layout (`_layout`) when it creates it, in a
    distribution's scope, and every later assignment puts the value where
    the layout says; it has no public way to give an existing variable
    one. `model_parallel` on JAX (`multigpu.partition.jax_sharding`) needs
    one for variables made outside its scope (an optimizer or a metric made
    before `compile`), which would otherwise stay on one device.

    Args:
        variable: A `keras.Variable` on the JAX backend.
        layout: A `keras.distribution.TensorLayout` (or a
            `jax.sharding.Sharding`).

    Example:
    >>> set_variable_layout(optimizer.iterations, replicated_layout)
    """
    variable._layout = layout
    variable.assign(variable.value)
