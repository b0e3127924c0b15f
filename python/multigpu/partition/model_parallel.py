"""`model_parallel` on TensorFlow: one model partitioned into pipeline stages.

The public `model_parallel` (`multigpu.partition.front`) calls
`partition_model` here on TensorFlow.

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

from multigpu import devices as devices_lib
from multigpu.arguments import is_int
from multigpu.devices import HOST_DEVICE
from multigpu.distribute import strategy as strategy_lib
from multigpu.engines.functional import layer_name, symbolic_graph
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


def partition_model(model, devices, split, microbatches):
    """`model_parallel` on TensorFlow: the model cut into stages.

    Called by `multigpu.partition.front.model_parallel`, which checked the
    backend and `microbatches`.

    Args:
        model: A built Sequential or functional Keras model.
        devices: The `devices` argument of `model_parallel`.
        split: Its `split` argument.
        microbatches: An int >= 1.

    Returns:
        A `PartitionedModel`.

    Raises:
        ValueError, TypeError: as `model_parallel` says.

    Example:
    >>> partitioned = partition_model(model, 2, None, 1)
    """
    symbolic_graph(model)
    check_standard_steps(model, "model_parallel")
    strategy_lib.check_outside_strategies("model_parallel")
    devices = _resolve_model_devices(devices, split)
    stages = resolve_stages(model, len(devices), split)
    StagePlan(model, stages, devices)  # reject uncuttable splits before copying
    template = place_template(model, stages, devices)
    return PartitionedModel(template, devices, stages, microbatches)
