"""`model_parallel` on JAX: each weight split across the devices by XLA.

On the JAX backend one model spans several devices by sharding its
weights, not by cutting it into stages: the devices form a `(1, k)` mesh
(`"batch"` of size 1, `"model"` of size k), every weight that can be is
split along one of its dimensions over the `"model"` axis, and Keras's
compiled step runs on the whole batch, with XLA partitioning each
operation after the weights it reads and moving what the others need.
Keras's own `keras.distribution.ModelParallel` does the placing: its
scope puts each new variable where its layout says, the optimizer's slots
beside their weights, and Keras's JAX trainer compiles the step for those
placements. The layouts are derived from the weights' shapes
(`weight_axis`), so the user writes no `LayoutMap`.

The rule, for `k` devices:

* a floating-point weight is split along its largest dimension that `k`
  divides (the last such one on a tie: a Dense kernel's units, a
  convolution's filters);
* a weight with no such dimension, and every non-floating one (random
  seeds, counters), is replicated: a whole copy on every device. That is
  allowed for weights under `REPLICATED_LIMIT_BYTES` (a bias of 10 classes
  on 4 devices); a larger one, or a model none of whose weights splits,
  is refused with a `ValueError` naming the weights, their shapes and the
  fix: no weight stays silently whole on every device.

The batch is not split (the `"batch"` axis has one device): every batch,
even or uneven, gives the template's numbers. The pipeline's arguments
(`split`, `microbatches`) have no meaning here and are refused.

The distribution is entered only around this model's own calls
(`compile`, `fit`, `evaluate`, `predict`, ...), never set for the
process: other models keep theirs.
"""

import contextlib
import math

import keras
import numpy as np
from keras import distribution as distribution_lib

from multigpu import internals
from multigpu.engines import copies
from multigpu.engines.functional import callable_graph, layer_name
from multigpu.engines.jax import guard
from multigpu.engines.template import (
    TemplateLayer,
    TemplateWrapper,
    compile_defaults,
    compile_template_alike,
)
from multigpu.messages import api, literal, literals, setting
from multigpu.runtime import jax as jax_runtime
from multigpu.step import train_function

# The mesh's axes: batches along the first (one device: never split),
# weights along the second.
BATCH_AXIS = "batch"
MODEL_AXIS = "model"

# A weight no dimension of which the device count divides is replicated
# (whole on every device) only below this many bytes: biases and
# normalization scales of sizes such as 10. A larger one would undo what
# model parallelism is for, and is refused.
REPLICATED_LIMIT_BYTES = 64 * 1024


def weight_bytes(variable):
    """Bytes of a Keras variable's whole value (its shape times its dtype)."""
    itemsize = np.dtype(keras.backend.standardize_dtype(variable.dtype)).itemsize
    return int(math.prod(variable.shape)) * itemsize


def _is_float(variable):
    return keras.backend.standardize_dtype(variable.dtype).startswith(
        ("float", "bfloat"))


def weight_axis(shape, dtype, count):
    """The dimension a weight is split along over `count` devices, or None.

    Args:
        shape: The weight's shape.
        dtype: Its dtype (only floating-point weights are split).
        count: The number of devices.

    Returns:
        The index of the largest dimension `count` divides (the last such
        one on a tie), or None: replicate the weight.

    Example:
    >>> weight_axis((784, 256), "float32", 4)
    0
    >>> weight_axis((64, 10), "float32", 4), weight_axis((10,), "float32", 4)
    (0, None)
    """
    name = keras.backend.standardize_dtype(dtype)
    if not name.startswith(("float", "bfloat")):
        return None
    candidates = [i for i, size in enumerate(shape)
                  if size is not None and size >= count and size % count == 0]
    if not candidates:
        return None
    return max(candidates, key=lambda i: (shape[i], i))


def weight_axes(shape, dtype, count):
    """The layout of a weight as mesh axis names, one per dimension.

    Example:
    >>> weight_axes((8, 16), "float32", 4)
    (None, 'model')
    """
    axis = weight_axis(shape, dtype, count)
    return tuple(MODEL_AXIS if i == axis else None for i in range(len(shape)))


def check_shardable(model, count):
    """Refuses a model whose weights would stay whole on every device.

    Args:
        model: A built Keras model.
        count: The number of devices.

    Raises:
        ValueError: naming the weights that cannot be split and are
            `REPLICATED_LIMIT_BYTES` or larger, or saying that no weight
            of the model can be split, with the fix.
    """
    weights = list({id(v): v for v in model.weights}.values())
    split = [v for v in weights if weight_axis(v.shape, v.dtype, count) is not None]
    whole = [v for v in weights if _is_float(v)
             and weight_axis(v.shape, v.dtype, count) is None
             and weight_bytes(v) >= REPLICATED_LIMIT_BYTES]
    fix = ("Use a number of devices that divides one of their dimensions "
           "(the `devices` argument), or give the layers sizes that are "
           f"multiples of {count}")
    if whole:
        named = [f"{v.path} {tuple(v.shape)}" for v in whole]
        raise ValueError(
            f"Invalid `model` for {api('model_parallel')} on "
            f"{count} devices: no dimension of {literals(named, 'or')} is a "
            f"multiple of {count}, so each would stay whole on every device "
            f"(weights of {REPLICATED_LIMIT_BYTES // 1024} KiB or more are "
            f"split, never copied). {fix}.")
    if count > 1 and not split:
        raise ValueError(
            f"Invalid `model` for {api('model_parallel')} on "
            f"{count} devices: none of the weights of {literal(model.name)} "
            f"has a dimension that is a multiple of {count}, so every "
            f"device would hold the whole model. {fix}.")


class ShapeDerivedLayouts(distribution_lib.ModelParallel):
    """Keras's `ModelParallel`, each new variable laid out by its shape.

    Used only while the template's copy is made: its variables are created
    where `weight_axes` puts them, no `LayoutMap` entry needed.

    Args:
        device_mesh: The `keras.distribution.DeviceMesh` of `device_mesh`.
    """

    def __init__(self, device_mesh):
        super().__init__(layout_map=distribution_lib.LayoutMap(device_mesh),
                         batch_dim_name=BATCH_AXIS)

    def get_variable_layout(self, variable):
        count = self.device_mesh.shape[
            self.device_mesh.axis_names.index(MODEL_AXIS)]
        return distribution_lib.TensorLayout(
            weight_axes(variable.shape, variable.dtype, count), self.device_mesh)


def device_mesh(devices):
    """The `(1, k)` Keras device mesh over `devices` (`"batch"`, `"model"`).

    Args:
        devices: Canonical device names (`multigpu.resolve_devices`).

    Example:
    >>> device_mesh(["/device:CPU:0", "/device:CPU:1"]).shape
    (1, 2)
    """
    found = [jax_runtime.device(d) for d in devices]
    return distribution_lib.DeviceMesh((1, len(found)), (BATCH_AXIS, MODEL_AXIS),
                                       found)


def shard_weights(model, devices):
    """A copy of `model` whose weights are split across `devices`.

    The copy (`copies.copy_in_scope`) is made in the scope of
    `ShapeDerivedLayouts`, so each variable is created where its layout
    puts it: no device ever holds a split weight whole. The copy is
    checked against `model` on a probe batch.

    Args:
        model: A built Keras model.
        devices: Canonical device names.

    Returns:
        The copy, with `model`'s weights and state.

    Raises:
        ValueError: as `check_shardable`, or when the model cannot be
            copied.
    """
    check_shardable(model, len(devices))
    mesh = device_mesh(devices)
    invalid = f"Invalid `model` for {api('model_parallel')}"
    fix = f"Use {api('multi_gpu_model')}, which needs no copy."
    copy = copies.copy_in_scope(model, ShapeDerivedLayouts(mesh), invalid, fix)
    # A variable made outside the copy's scope (a layer that creates weights
    # outside build()) would sit on one device: give it its layout now.
    for variable in copy.variables:
        layout = distribution_lib.TensorLayout(
            weight_axes(variable.shape, variable.dtype, len(devices)), mesh)
        if not _placed_as(variable, layout):
            internals.set_variable_layout(variable, layout)
    return copy


def _placed_as(variable, layout):
    sharding = getattr(variable.value, "sharding", None)
    return sharding is not None and sharding.is_equivalent_to(
        layout.backend_layout, len(variable.shape))


def device_bytes(variables, devices):
    """Bytes of `variables` on each device, read from their shards.

    Args:
        variables: Keras variables.
        devices: Canonical device names.

    Returns:
        `{device: bytes}`, over the shards each device holds.
    """
    by_jax = {jax_runtime.device(d): d for d in devices}
    held = dict.fromkeys(devices, 0)
    for variable in {id(v): v for v in variables}.values():
        for shard in variable.value.addressable_shards:
            if shard.device in by_jax:
                held[by_jax[shard.device]] += int(shard.data.nbytes)
    return held


@keras.saving.register_keras_serializable(package="multigpu")
class ShardedWeightsTemplate(TemplateLayer):
    """Runs the template, whose weights are split across `devices`.

    Args:
        template: The template model (from `shard_weights`).
        devices: Canonical names of the devices.
    """

    config_keys = ("devices",)

    def __init__(self, template, devices, **kwargs):
        super().__init__(template, **kwargs)
        self.devices = list(devices)

    def call(self, inputs, training=None):
        return self.template(inputs, training=training)


def _input_like(tensor):
    """The wrapper's input for one of the template's: the same batch shape
    (a fixed batch size stays: the batch is not split)."""
    return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype,
                       sparse=tensor.sparse, name=layer_name(tensor))


@keras.saving.register_keras_serializable(package="multigpu")
class ShardedWeightsModel(guard.HostGuarded, TemplateWrapper):
    """A Keras model whose template's weights are split across `devices`.

    What `model_parallel` returns on the JAX backend. Use it exactly like
    the template: `compile`, `fit`, `evaluate`, `predict`. Each call runs
    in the scope of this model's `keras.distribution.ModelParallel`
    (`distribution`), so Keras's compiled steps keep every weight, and the
    optimizer's slots of it, split as placed; the batch is whole on every
    device. `save`, `save_weights` and `load_weights` act on the template,
    so files are plain Keras models.

    Args:
        template: A built Keras model; it is copied, not changed
            (`shard_weights`): `template` is the copy, which holds the
            trained weights.
        devices: Canonical names of >= 1 devices.

    Raises:
        ValueError: as `check_shardable`.

    Example:
    >>> sharded = ShardedWeightsModel(model, ["/device:CPU:0", "/device:CPU:1"])
    >>> sharded.compile(optimizer="adam", loss="mse")
    >>> sharded.fit(x, y, batch_size=42)
    >>> sharded.weight_table()[0]["variable_bytes"]   # on the first device
    """

    parallelism = "model parallelism"
    engine = "jax"
    name_suffix = "sharded"

    def __init__(self, template, devices, **kwargs):
        devices = list(devices)
        placed = shard_weights(template, devices)
        super().__init__(
            placed, callable_graph, _input_like,
            lambda: ShardedWeightsTemplate(placed, devices, name="sharded_weights"),
            **kwargs)

    @property
    def distribution(self):
        """The `keras.distribution.ModelParallel` this model's calls run in.

        Its `LayoutMap` is empty: variables made in its scope (metrics,
        an optimizer's step count) are replicated, and the optimizer's
        slots take their weight's layout.
        """
        def make():
            mesh = device_mesh(self.devices)
            return distribution_lib.ModelParallel(
                layout_map=distribution_lib.LayoutMap(mesh),
                batch_dim_name=BATCH_AXIS)
        return internals.untracked(self, "_weights_distribution", make=make)

    @contextlib.contextmanager
    def _scope(self):
        """This model's distribution, for one call; the caller's after it."""
        with self.distribution.scope():
            yield

    def weight_layouts(self):
        """`{path: axes}`: how each template weight is laid out on the mesh.

        Example:
        >>> sharded.weight_layouts()["sequential/dense/kernel"]
        (None, 'model')
        """
        return {v.path: tuple(v.value.sharding.spec) + (None,) * (
                    len(v.shape) - len(v.value.sharding.spec))
                for v in self.template.weights}

    def weight_table(self):
        """Per device: the template's weights it holds, as read from the shards.

        Returns:
            A list of dicts `{device, variables, variable_bytes}`: the
            number of weights of which the device holds a shard or a copy,
            and the bytes of those shards.
        """
        held = device_bytes(self.template.weights, self.devices)
        count = {d: 0 for d in self.devices}
        by_jax = {jax_runtime.device(d): d for d in self.devices}
        for variable in {id(v): v for v in self.template.weights}.values():
            for device in {by_jax.get(s.device) for s in
                           variable.value.addressable_shards} - {None}:
                count[device] += 1
        return [{"device": d, "variables": count[d], "variable_bytes": held[d]}
                for d in self.devices]

    def bytes_by_device(self, optimizer):
        """What each device holds of the state training keeps (`memory_plan`).

        Weights and gradients (one per trainable weight, laid out as it)
        are read from the weights' shards; the optimizer's variables are
        read from `optimizer`, built here in this model's scope, where its
        slots take their weights' layouts.

        Args:
            optimizer: An unbuilt Keras optimizer, built for the template's
                trainable weights here (`memory_plan` makes a fresh one).

        Returns:
            `{device: {"weights", "gradients", "optimizer"}}`, in bytes.
        """
        with self._scope():
            optimizer.build(self.template.trainable_variables)
        # Its step count and learning rate, made outside the scope, are
        # replicated as training replicates them.
        _replicate_strays(optimizer.variables, self.distribution.device_mesh)
        weights = device_bytes(self.template.variables, self.devices)
        gradients = device_bytes(self.template.trainable_variables, self.devices)
        slots = device_bytes(optimizer.variables, self.devices)
        return {d: {"weights": weights[d], "gradients": gradients[d],
                    "optimizer": slots[d]} for d in self.devices}

    # Keras's steps, as on one device: XLA partitions them after the
    # weights' layouts (the TensorFlow engines' steps are not these).

    def train_step(self, state, data):
        return keras.Model.train_step(self, state, data)

    def test_step(self, state, data):
        return keras.Model.test_step(self, state, data)

    def predict_step(self, state, data):
        return keras.Model.predict_step(self, state, data)

    jit_compile = True

    def compile(self, *args, jit_compile=True, run_eagerly=False, **kwargs):
        """Compiles like `keras.Model.compile`, in this model's scope.

        The template is compiled alike and shares this model's optimizer.

        Raises:
            ValueError: for `jit_compile=False` or `run_eagerly=True`: the
                step XLA compiles is the one it partitions across devices.
        """
        for name, value, needed in (("jit_compile", jit_compile, True),
                                    ("run_eagerly", run_eagerly, False)):
            if value not in (needed, "auto"):
                raise ValueError(
                    f"Invalid `{name}`: received {literal(value)}. On JAX "
                    f"{api('model_parallel')} splits the weights inside the "
                    "step XLA compiles and partitions across the devices. "
                    f"Leave {setting(name, needed)}."
                )
        with self._scope():
            args, kwargs = compile_defaults(self, args, kwargs)
            keras.Model.compile(self, *args, jit_compile=True, **kwargs)
            compile_template_alike(self, args, kwargs)

    def fit(self, *args, **kwargs):
        with self._scope():
            return self.guarded_fit(args, kwargs)

    def evaluate(self, *args, **kwargs):
        with self._scope():
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        with self._scope():
            return super().predict(*args, **kwargs)

    def train_on_batch(self, *args, **kwargs):
        with self._scope():
            return super().train_on_batch(*args, **kwargs)

    def test_on_batch(self, *args, **kwargs):
        with self._scope():
            return super().test_on_batch(*args, **kwargs)

    def predict_on_batch(self, *args, **kwargs):
        with self._scope():
            return super().predict_on_batch(*args, **kwargs)

    # Keras's step functions, made after every variable of the state is on
    # the mesh: an optimizer or metric made before `compile` (outside the
    # scope) holds its variables on one device, which no step over the
    # mesh can take.

    def make_train_function(self, force=False):
        self._place_on_mesh()
        keras.Model.make_train_function(self, force)
        if self.train_function is not None:
            # Registered again for each new function Keras makes (the
            # chain it replaces is gone); the same link again changes nothing.
            train_function.link(self, "guard", self._guarding)
        return self.train_function

    def _guarding(self, inner):
        """The train function's `"guard"` link: each call's batches checked first."""

        def train(state, iterator):
            return inner(state, self._checked(state, iterator))

        return train

    def make_test_function(self, force=False):
        self._place_on_mesh()
        return keras.Model.make_test_function(self, force)

    def make_predict_function(self, force=False):
        self._place_on_mesh()
        return keras.Model.make_predict_function(self, force)

    def _place_on_mesh(self):
        """Replicates on the mesh every variable of the state that is not on it."""
        optimizer = getattr(self, "optimizer", None)
        _replicate_strays(
            [*self.variables, *self.metrics_variables,
             *(optimizer.variables if optimizer is not None else [])],
            self.distribution.device_mesh)

    @classmethod
    def from_template(cls, template, devices, **config):
        """The model over a deserialized template, its weights split anew."""
        return cls(template, devices, **config)


def _replicate_strays(variables, mesh):
    """Replicates on `mesh` each of `variables` that is not on all its devices.

    Args:
        variables: Keras variables.
        mesh: A `keras.distribution.DeviceMesh`.
    """
    devices = set(mesh.devices.flat)
    for variable in variables:
        sharding = getattr(variable.value, "sharding", None)
        if sharding is None or set(sharding.device_set) != devices:
            internals.set_variable_layout(variable, distribution_lib.TensorLayout(
                (None,) * len(variable.shape), mesh))


def check_pipeline_arguments(split, microbatches):
    """Refuses the pipeline's arguments, which JAX's model parallelism lacks.

    Raises:
        ValueError: for `split` other than None or `microbatches` other
            than 1, naming the argument and what to do.
    """
    if split is not None:
        raise ValueError(
            f"Invalid `split`: received {literal(split)}. On the JAX backend "
            f"{api('model_parallel')} splits every weight across the devices "
            "(XLA's sharding) instead of cutting the model into stages, so "
            f"there are no stages to choose. Leave {setting('split', None)}, "
            "or use the TensorFlow backend for pipeline stages.")
    if microbatches != 1:
        raise ValueError(
            f"Invalid `microbatches`: received {literal(microbatches)}. On "
            f"the JAX backend {api('model_parallel')} runs every batch whole "
            "on every device, its weights split between them, with no "
            f"pipeline to feed. Leave {setting('microbatches', 1)}, or use "
            "the TensorFlow backend for pipelined stages.")


def model_parallel(model, devices, split=None, microbatches=1):
    """`multigpu.model_parallel` on JAX (see there): a `ShardedWeightsModel`.

    Args:
        model: A built Keras model.
        devices: Canonical device names.
        split: Must be None (no stages on JAX).
        microbatches: Must be 1.

    Returns:
        A `ShardedWeightsModel`.

    Raises:
        ValueError: for `split` or `microbatches`, and as `check_shardable`.

    Example:
    >>> sharded = model_parallel(model, ["/device:CPU:0", "/device:CPU:1"])
    """
    check_pipeline_arguments(split, microbatches)
    return ShardedWeightsModel(model, devices)
