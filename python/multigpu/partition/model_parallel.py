"""`model_parallel`: one model partitioned across devices (pipeline stages).

`multi_gpu_model` copies the whole model onto every device. When one copy
does not fit on a device, the model itself must be cut: its layers are
partitioned into consecutive stages, one per device; each stage's weights
live on its device, its forward and backward ops run there, and activations
move from stage to stage. With `microbatches=k` every batch is cut into `k`
micro-batches that flow through the stages one after the other (GPipe), so
stage `s` can work on micro-batch `m + 1` while stage `s + 1` works on `m`.
"""

import keras
import tensorflow as tf

from multigpu import backends
from multigpu import devices as devices_lib
from multigpu.arguments import check_int, is_int
from multigpu.devices import HOST_DEVICE
from multigpu.distribute import strategy as strategy_lib
from multigpu.engines.functional import callable_graph, layer_name, symbolic_graph
from multigpu.engines.own_steps import check_standard_steps
from multigpu.engines.template import TemplateWrapper, built_like
from multigpu.engines.tensorflow.trainer import TensorFlowTrainer
from multigpu.messages import api, literal, setting
from multigpu.partition.pipeline import StagePlan, Stages
from multigpu.partition.stages import is_group, resolve_stages, staged_layers
from multigpu.variables import variable_bytes, variable_device


def place_template(model, stages, devices):
    """Copies `model` with each stage's weights created on its device.

    Args:
        model: A built Keras model.
        stages: One list of top-level layer names per stage.
        devices: One device name per stage.

    Returns:
        A model of the same class, architecture and weight values, whose
        variables live on their stage's device.

    Raises:
        ValueError: if the model cannot be cloned (its layers lack
            `get_config`/`from_config`).
    """
    device_of = {name: devices[s] for s, names in enumerate(stages)
                 for name in names}

    def clone_layer(layer):
        with tf.device(device_of.get(layer.name, HOST_DEVICE)):
            clone = layer.__class__.from_config(layer.get_config())
            if not isinstance(layer, keras.layers.Layer):
                return clone  # a weightless operation (keras.ops.*)
            build_config = layer.get_build_config()
            if build_config and not clone.built:
                clone.build_from_config(build_config)
        return clone

    def call_layer(layer, *args, **kwargs):
        with tf.device(device_of.get(layer.name, HOST_DEVICE)):
            return layer(*args, **kwargs)

    extra = {} if isinstance(model, keras.Sequential) else {
        "call_function": call_layer
    }
    try:
        with built_like(model):
            placed = keras.models.clone_model(
                model, clone_function=clone_layer, **extra
            )
    except (ValueError, TypeError, NotImplementedError) as error:
        raise ValueError(
            f"Invalid `model`: {literal(model.name)} cannot be rebuilt with its "
            f"weights on the stage devices ({error}). Every layer needs "
            "get_config()/from_config(); custom layers must implement them."
        ) from None
    misplaced = [
        f"{v.path} on {variable_device(v)} (expected {device_of[layer.name]})"
        for layer in staged_layers(placed) for v in layer.weights
        if variable_device(v) != device_of[layer.name]
    ]
    if misplaced:
        raise ValueError(
            f"Invalid `model`: some weights of {literal(model.name)} could not be "
            f"created on their stage's device: {literal(misplaced)}. Their layers "
            "create weights outside build(); implement build() (or "
            "get_build_config()/build_from_config()) for them."
        )
    placed.set_weights(model.get_weights())
    return placed


@keras.saving.register_keras_serializable(package="multigpu")
class PartitionedModel(TensorFlowTrainer, TemplateWrapper):
    """A Keras model that runs `template` as stages on several devices.

    Use it exactly like the template: `compile`, `fit`, `evaluate`,
    `predict`. Its weights are the template's, which live on the stage
    devices; its `template` and `devices` (one per stage) are those of its
    `Stages` layer. `save`, `save_weights` and `load_weights` act on
    `template`, so files are plain Keras models that load with
    `keras.models.load_model`.
    """

    parallelism = "model parallelism"
    config_keys = ("devices", "stages", "microbatches")
    name_suffix = "partitioned"

    def __init__(self, template, devices, stages, microbatches=1, **kwargs):
        super().__init__(
            template, symbolic_graph,
            lambda tensor: _input_like(tensor, microbatches),
            lambda: Stages(template, devices, stages, microbatches,
                           name="stages"),
            **kwargs)

    @property
    def stages_layer(self):
        """The `Stages` layer that runs the pipeline."""
        return self.template_layer

    @property
    def stages(self):
        """The layer names of each stage, in stage order."""
        return [list(names) for names in self.template_layer.stages]

    @property
    def microbatches(self):
        """Number of micro-batches each batch is pipelined as."""
        return self.template_layer.microbatches

    def stage_table(self):
        """Per stage: device, layers, number and bytes of its variables.

        Returns:
            A list of dicts `{stage, device, layers, variables,
            variable_bytes}`, read from where the variables really live.
        """
        rows = []
        for stage, (device, names) in enumerate(zip(self.devices, self.stages)):
            variables = [
                v for name in names
                for v in self.template.get_layer(name).weights
            ]
            variables = list({id(v): v for v in variables}.values())
            rows.append({
                "stage": stage,
                "device": device,
                "layers": list(names),
                "variables": len(variables),
                "variable_bytes": sum(variable_bytes(v) for v in variables),
            })
        return rows

    def _check_batch_size(self, batch_size):
        """Refuses a batch smaller than `microbatches`: every step would run
        micro-batches of no rows (the results are right, the pipelining
        asked for is not there)."""
        if is_int(batch_size) and 0 < int(batch_size) < self.microbatches:
            batch_size = int(batch_size)
            rebuilt = api("model_parallel",
                          f"model, {setting('microbatches', batch_size)}")
            raise ValueError(
                f"Invalid `batch_size`: received {batch_size} for a model "
                f"pipelined with {setting('microbatches', self.microbatches)}: "
                f"each batch is cut into {self.microbatches} micro-batches, so "
                f"{self.microbatches - batch_size} of them would have no rows "
                "in every step. Use a batch_size of at least "
                f"{self.microbatches}, or build the model with "
                f"{rebuilt}."
            )

    def fit(self, *args, **kwargs):
        self._check_batch_size(_batch_size_argument(args, kwargs, 2))
        return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        self._check_batch_size(_batch_size_argument(args, kwargs, 2))
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        self._check_batch_size(_batch_size_argument(args, kwargs, 1))
        return super().predict(*args, **kwargs)

    @classmethod
    def from_template(cls, template, devices, **config):
        """The model over a deserialized template, its weights placed anew."""
        placed = place_template(template, config["stages"], devices)
        return cls(placed, devices, **config)


def _batch_size_argument(args, kwargs, position):
    """The `batch_size` of a `fit`/`evaluate`/`predict` call, or None."""
    if "batch_size" in kwargs:
        return kwargs["batch_size"]
    return args[position] if len(args) > position else None


def _input_like(tensor, microbatches):
    if microbatches > 1 and tensor.shape[0] is not None:
        raise ValueError(
            f"Invalid `microbatches`: received {microbatches}, but input "
            f"{literal(tensor.name)} has a fixed batch size ({tensor.shape}); "
            "micro-batches slice each batch, so build the model with "
            "shape=... rather than batch_shape=..., or use microbatches=1."
        )
    return keras.Input(
        batch_shape=tensor.shape, dtype=tensor.dtype, sparse=tensor.sparse,
        name=layer_name(tensor),
    )


def _resolve_model_devices(devices, split):
    if devices is None and isinstance(split, (list, tuple)) and split:
        if all(is_group(entry) for entry in split):
            return devices_lib.resolve_devices(len(split))
        return devices_lib.resolve_devices(len(split) + 1)
    return devices_lib.resolve_devices(devices)


def model_parallel(model, devices=None, split=None, microbatches=1):
    """Partitions one model across devices (model parallelism).

    The model's layers are cut into consecutive stages, one per device. Each
    stage's weights are created on its device and its forward and backward
    ops run there; activations move from stage to stage. Use it when one copy
    of the model does not fit on one device (`multi_gpu_model` copies the
    whole model onto every device). Outputs and training steps are those of
    `model`.

    On the JAX backend the model is not cut into stages: every weight is
    split across the devices instead (`multigpu.partition.jax_sharding`),
    along its largest dimension the number of devices divides, and each
    device computes on the whole batch. A weight with no such dimension is
    replicated when it is smaller than 64 KiB; a larger one, or a model
    none of whose weights splits, is refused. `split` and `microbatches`
    describe stages and are refused there.

    Args:
        model: A built Keras model (Sequential or functional, branches
            allowed). It is copied, not changed: the returned model's
            `template` holds the placed, trained weights.
        devices: As for `multi_gpu_model(gpus=...)`: `None` (every GPU, or
            every logical CPU device without a GPU; with `split` given, the
            first `len(split) + 1` devices), an int >= 2, a list of GPU ids
            or a list of device names. One stage per device.
        split: `None` balances the bytes of the weights between the
            stages. Otherwise the names (or `model.layers` indices) of the
            layers where stages 2, 3, ... start, in `model.layers` order,
            e.g. `["dense_2", "dense_4"]`; or one list of layer names per
            stage, e.g. `[["left_a", "left_b"], ["right", "merge"]]`, to put
            branches on different devices. A stage may only read outputs of
            its own or earlier stages.
        microbatches: Cut every batch into this many micro-batches that
            flow through the stages in turn (GPipe pipelining), so stages
            can overlap. Gradients are summed over micro-batches and there is
            one optimizer step per batch; results equal `microbatches=1`
            (layers using batch statistics see micro-batches).

    Returns:
        A `PartitionedModel` (a `keras.Model`) with `.template`, `.devices`,
        `.stages` and `.stage_table()`; on JAX a
        `jax_sharding.ShardedWeightsModel` with `.template`, `.devices`,
        `.weight_layouts()` and `.weight_table()`. Its `save`/`save_weights`
        write the template, which loads back with plain
        `keras.models.load_model`.

    Raises:
        ValueError: for devices that do not exist, more stages than layers,
            unknown layer names or indices in `split`, a split where the
            model cannot be cut (the message says why), or an invalid
            `microbatches`; on JAX, for `split` other than None,
            `microbatches` other than 1, or weights that cannot be split
            (`jax_sharding.check_shardable`).
        UnsupportedBackendError: on a backend other than TensorFlow and
            JAX.
        TypeError: if `model` is not a `keras.Model` or `split` not a list.

    Example:
    >>> partitioned = multigpu.model_parallel(model, devices=4)
    >>> partitioned.stages          # layer names per device
    >>> partitioned.compile(optimizer="adam", loss="mse")
    >>> partitioned.fit(x, y, batch_size=64)
    >>> partitioned.save("model.keras")   # a plain Keras model
    """
    backends.require_backend(
        "model_parallel", "TensorFlow's device placement (tf.device), which "
        "puts each stage's weights and operations on its device, or JAX's "
        "sharding of the weights", backend=("tensorflow", "jax"))
    microbatches = check_int("microbatches", microbatches, 1, expected=(
        "an int >= 1 (1: no pipelining; k: each batch runs as k micro-batches "
        "that overlap across stages)"))
    if backends.is_jax():
        # Imported here: the JAX path runs none of the stages' TensorFlow code.
        from multigpu.partition import jax_sharding

        callable_graph(model)
        check_standard_steps(model, "model_parallel")
        jax_sharding.check_pipeline_arguments(split, microbatches)
        return jax_sharding.model_parallel(
            model, devices_lib.resolve_devices(devices))
    symbolic_graph(model)
    check_standard_steps(model, "model_parallel")
    strategy_lib.check_outside_strategies("model_parallel")
    devices = _resolve_model_devices(devices, split)
    stages = resolve_stages(model, len(devices), split)
    StagePlan(model, stages, devices)  # reject uncuttable splits before copying
    template = place_template(model, stages, devices)
    return PartitionedModel(template, devices, stages, microbatches)
