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
import numpy as np
import tensorflow as tf

from multigpu import devices as devices_lib
from multigpu import replicas
from multigpu.messages import literal, setting

HOST_DEVICE = replicas.HOST_DEVICE
_MAX_NAMES_SHOWN = 30


# ---------------------------------------------------------------------------
# The model's graph: symbolic inputs/outputs, nodes in execution order.


def _graph_of(model):
    """The functional graph of `model` (its own layers), validated."""
    return replicas.symbolic_graph(model)


def _staged_layers(model):
    """The model's top-level layers that belong to a stage, in model order."""
    return [
        layer for layer in model.layers
        if not isinstance(layer, keras.layers.InputLayer)
    ]


def _execution_order(graph):
    """The graph's computing nodes in an order that respects their inputs."""
    ready = {id(x) for x in graph.inputs}
    order = []
    for depth in sorted(graph._nodes_by_depth, reverse=True):
        for node in graph._nodes_by_depth[depth]:
            if not node.operation or node.is_input:
                continue
            if any(id(x) not in ready for x in node.input_tensors):
                continue
            order.append(node)
            ready.update(id(x) for x in node.outputs)
    return order


def _variable_bytes(variables):
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables
    )


def _layer_bytes(layers):
    """Bytes of each layer's weights, each variable counted once."""
    seen = set()
    sizes = []
    for layer in layers:
        fresh = [v for v in layer.weights if id(v) not in seen]
        seen.update(id(v) for v in fresh)
        sizes.append(_variable_bytes(fresh))
    return sizes


# ---------------------------------------------------------------------------
# Choosing the stages.


def balanced_split(sizes, num_stages):
    """Cuts a sequence into `num_stages` consecutive, non-empty groups.

    Minimises the largest group's total size (ties: the largest group's
    length), by dynamic programming over all cut positions.

    Args:
        sizes: Non-negative sizes of the items, in order.
        num_stages: Number of groups, `1 <= num_stages <= len(sizes)`.

    Returns:
        The indices where groups `1 .. num_stages - 1` start.

    Example:
    >>> balanced_split([6, 1, 1, 1, 1, 1, 1], 2)
    [1]
    """
    n = len(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)

    def cost(i, j):
        return (prefix[j] - prefix[i], j - i)

    # best[k][j]: (cost, cut) of the first j items in k groups.
    best = [[None] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = ((0, 0), None)
    for k in range(1, num_stages + 1):
        for j in range(k, n - (num_stages - k) + 1):
            candidates = (
                (max(best[k - 1][i][0], cost(i, j)), i)
                for i in range(k - 1, j)
                if best[k - 1][i] is not None
            )
            best[k][j] = min(candidates)
    starts, j = [], n
    for k in range(num_stages, 0, -1):
        j = best[k][j][1]
        starts.append(j)
    return sorted(starts)[1:]


def _nested_owner(model, name):
    """The top-level layer that contains a nested layer called `name`."""
    for layer in _staged_layers(model):
        inner = getattr(layer, "_flatten_layers", None)
        if inner and any(sub.name == name for sub in inner(include_self=False)):
            return layer.name
    return None


def _names_hint(layers):
    names = [layer.name for layer in layers]
    shown = names[:_MAX_NAMES_SHOWN]
    more = f" ... ({len(names) - len(shown)} more)" if len(names) > len(shown) else ""
    return f"{literal(shown)}{more}"


def _position(model, layers, entry):
    """Position in `layers` of a split entry (a layer name or model index)."""
    if isinstance(entry, str):
        for i, layer in enumerate(layers):
            if layer.name == entry:
                return i
        owner = _nested_owner(model, entry)
        if owner is not None:
            raise ValueError(
                f"Invalid `split`: layer {literal(entry)} is inside the nested "
                f"model/layer {literal(owner)}, which is one layer of "
                f"{literal(model.name)} and cannot be cut inside. Start a stage at "
                f"{literal(owner)} or at a layer after it, or build the model from "
                "the nested model's layers."
            )
        raise ValueError(
            f"Invalid `split`: unknown layer name {literal(entry)}. The layers of "
            f"{literal(model.name)} are {_names_hint(layers)}."
        )
    if devices_lib._is_int(entry):
        index = int(entry)
        if not -len(model.layers) <= index < len(model.layers):
            raise ValueError(
                f"Invalid `split`: layer index {index} is out of range for "
                f"{literal(model.name)}, whose `model.layers` has "
                f"{len(model.layers)} entries."
            )
        layer = model.layers[index]
        if isinstance(layer, keras.layers.InputLayer):
            raise ValueError(
                f"Invalid `split`: model.layers[{index}] is the input "
                f"{literal(layer.name)}; stages start at computing layers. "
                f"Use one of {_names_hint(layers)}."
            )
        return layers.index(layer)
    raise TypeError(
        f"Invalid `split`: entry {literal(entry)} of type {type(entry).__name__} is "
        "neither a layer name (str) nor an index into `model.layers` (int)."
    )


def _stages_from_starts(model, layers, split, num_stages):
    positions = [_position(model, layers, entry) for entry in split]
    if len(positions) == num_stages and positions and positions[0] == 0:
        positions = positions[1:]
    if len(positions) != num_stages - 1:
        raise ValueError(
            f"Invalid `split`: received {literal(split)}, {len(split)} start "
            f"point(s) for {num_stages} stages (one per device). Give "
            f"{num_stages - 1} start point(s), the first layer of each stage "
            "after the first, or one list of layer names per stage."
        )
    if any(b <= a for a, b in zip([0] + positions, positions)):
        order = [layers[p].name for p in positions]
        raise ValueError(
            f"Invalid `split`: the stage start points {literal(order)} must be "
            "distinct, after the first layer and in the order of "
            f"`model.layers` ({_names_hint(layers)}); every stage needs at "
            "least one layer."
        )
    bounds = [0] + positions + [len(layers)]
    return [
        [layer.name for layer in layers[bounds[i]:bounds[i + 1]]]
        for i in range(num_stages)
    ]


def _stages_from_sets(model, layers, split, num_stages):
    if len(split) != num_stages:
        raise ValueError(
            f"Invalid `split`: received {len(split)} layer groups for "
            f"{num_stages} stages (one per device); give exactly one list of "
            "layers per device."
        )
    stage_of = {}
    for stage, group in enumerate(split):
        if not group:
            raise ValueError(
                f"Invalid `split`: group {stage} is empty; every stage needs "
                "at least one layer."
            )
        for entry in group:
            name = layers[_position(model, layers, entry)].name
            if name in stage_of:
                raise ValueError(
                    f"Invalid `split`: layer {literal(name)} is listed in groups "
                    f"{stage_of[name]} and {stage}; a layer (and its weights) "
                    "belongs to exactly one stage."
                )
            stage_of[name] = stage
    missing = [layer.name for layer in layers if layer.name not in stage_of]
    if missing:
        raise ValueError(
            f"Invalid `split`: layer(s) {literal(missing)} are in no group. With one "
            "list of layers per stage, every layer must be listed."
        )
    return [
        [layer.name for layer in layers if stage_of[layer.name] == stage]
        for stage in range(num_stages)
    ]


def _is_group(entry):
    return isinstance(entry, (list, tuple))


def resolve_stages(model, num_stages, split=None):
    """Partitions `model`'s layers into `num_stages` stages.

    Args:
        model: A built Sequential or functional Keras model.
        num_stages: Number of stages, one per device.
        split: `None` to balance the bytes of the weights between stages;
            a list of `num_stages - 1` layer names or `model.layers`
            indices where stages 2, 3, ... start (`num_stages` entries are
            accepted when the first is the first layer); or a list of
            `num_stages` lists of layer names, the layers of each stage.

    Returns:
        A list of `num_stages` lists of layer names.

    Raises:
        ValueError: for more stages than layers, unknown names or indices,
            start points out of order, or groups that overlap or miss layers.
        TypeError: for a `split` that is not a list.
    """
    layers = _staged_layers(model)
    if num_stages > len(layers):
        raise ValueError(
            f"Invalid `devices`: {num_stages} stages (one per device) for "
            f"{literal(model.name)}, which has only {len(layers)} layer(s) "
            f"{_names_hint(layers)}. Use at most {len(layers)} devices."
        )
    if split is None:
        starts = [
            layers[i].name
            for i in balanced_split(_layer_bytes(layers), num_stages)
        ]
        return _stages_from_starts(model, layers, starts, num_stages)
    if isinstance(split, str) or not isinstance(split, (list, tuple)):
        raise TypeError(
            f"Invalid `split`: received {literal(split)} of type "
            f"{type(split).__name__}; expected {literal(None)}, a list of layer names or "
            "indices where stages start, or a list of lists of layer names."
        )
    if split and all(_is_group(entry) for entry in split):
        return _stages_from_sets(model, layers, split, num_stages)
    if any(_is_group(entry) for entry in split):
        raise TypeError(
            f"Invalid `split`: received {literal(split)}, which mixes layer lists "
            "with single layers; use either start points or one list per "
            "stage."
        )
    return _stages_from_starts(model, layers, list(split), num_stages)


# ---------------------------------------------------------------------------
# The plan: which nodes each stage runs, what flows between stages.


class _Plan:
    """Nodes of each stage and the tensors that cross stage boundaries."""

    def __init__(self, template, stages, devices):
        self.graph = _graph_of(template)
        stage_of_layer = {
            name: s for s, names in enumerate(stages) for name in names
        }
        producer = {}  # tensor id -> (stage, operation name)
        nodes = [[] for _ in stages]
        for node in _execution_order(self.graph):
            stage = self._stage_of(node, stage_of_layer, producer)
            self._check_inputs(node, stage, producer, devices)
            nodes[stage].append(node)
            for x in node.outputs:
                producer[id(x)] = (stage, node.operation.name)
        self.nodes = nodes
        self.needs, self.exports = self._boundaries(nodes, producer)
        self._check_masks(producer, devices)

    @staticmethod
    def _stage_of(node, stage_of_layer, producer):
        name = node.operation.name
        if isinstance(node.operation, keras.layers.Layer) and (
            name in stage_of_layer
        ):
            return stage_of_layer[name]
        # Weightless operations (keras.ops on symbolic tensors) run with the
        # latest stage whose output they read.
        return max(
            [producer[id(x)][0] for x in node.input_tensors if id(x) in producer]
            or [0]
        )

    @staticmethod
    def _check_inputs(node, stage, producer, devices):
        for x in node.input_tensors:
            source = producer.get(id(x))
            if source is not None and source[0] > stage:
                raise ValueError(
                    "Invalid `split`: the model cannot be cut there. Layer "
                    f"{literal(node.operation.name)} (stage {stage}, "
                    f"{devices[stage]}) reads the output of layer "
                    f"{literal(source[1])}, which is in the later stage "
                    f"{source[0]} ({devices[source[0]]}); stages run in "
                    "order, each reading only from earlier stages. Put both "
                    "layers in one stage, or a reused (shared) layer in the "
                    "stage of its last use."
                )

    def _boundaries(self, nodes, producer):
        needs, exports = [], []
        outputs = {id(x) for x in self.graph.outputs}
        for stage, stage_nodes in enumerate(nodes):
            needed = []
            for node in stage_nodes:
                for x in node.input_tensors:
                    source = producer.get(id(x))
                    if (source is None or source[0] != stage) and (
                        id(x) not in needed
                    ):
                        needed.append(id(x))
            needs.append(needed)
        for stage, stage_nodes in enumerate(nodes):
            later = {i for s in range(stage + 1, len(nodes)) for i in needs[s]}
            exports.append([
                id(x) for node in stage_nodes for x in node.outputs
                if id(x) in later or id(x) in outputs
            ])
        return needs, exports

    def _check_masks(self, producer, devices):
        tensors = {}
        for stage_nodes in self.nodes:
            for node in stage_nodes:
                tensors.update((id(x), x) for x in node.outputs)
        for stage, needed in enumerate(self.needs):
            for tensor_id in needed:
                tensor = tensors.get(tensor_id)
                if getattr(tensor, "_keras_mask", None) is not None:
                    source = producer[tensor_id]
                    raise ValueError(
                        "Invalid `split`: the model cannot be cut there. The "
                        f"output of layer {literal(source[1])} (stage {source[0]}) "
                        f"carries a Keras mask (e.g. from {setting('mask_zero', True)} or "
                        f"Masking) into stage {stage} ({devices[stage]}); "
                        "masks do not cross stage boundaries. Start the "
                        "stage after the layers that consume the mask."
                    )


def _call_args(node, values, training):
    args, kwargs = node.arguments.fill_in(values)
    if training is not None and "training" in getattr(
        node.operation, "_call_context_args", ()
    ):
        kwargs["training"] = training
    return args, kwargs


# ---------------------------------------------------------------------------
# The layer that runs the stages.


class Stages(replicas.TemplateLayer):
    """Runs `template` as a pipeline of stages, one per device.

    Not usually built directly: `model_parallel` wraps it in a
    `PartitionedModel`.

    Args:
        template: A built Keras model whose variables already live on the
            stage devices (see `place_template`).
        devices: Canonical device names, one per stage.
        stages: One list of top-level layer names per stage.
        microbatches: Number of micro-batches each batch is cut into.
    """

    def __init__(self, template, devices, stages, microbatches=1, **kwargs):
        super().__init__(**kwargs)
        self.template = template
        self.devices = list(devices)
        self.stages = [list(names) for names in stages]
        self.microbatches = int(microbatches)
        self._plan = _Plan(template, self.stages, self.devices)

    def _plain_forward(self, stage, training):
        """Runs the nodes of one stage: stage inputs -> stage exports."""
        plan = self._plan

        def forward(*inputs):
            values = dict(zip(plan.needs[stage], inputs))
            for node in plan.nodes[stage]:
                args, kwargs = _call_args(node, values, training)
                outputs = node.operation(*args, **kwargs)
                values.update(
                    zip((id(x) for x in node.outputs), keras.tree.flatten(outputs))
                )
            return [values[i] for i in plan.exports[stage]]

        return forward

    def _stage_forward(self, stage, training):
        forward = self._plain_forward(stage, training)
        if self.microbatches == 1:
            return forward
        return replicas.forward_only_when_empty(
            forward, self._plain_forward(stage, False))

    def _run(self, flat_inputs, training):
        plan = self._plan
        values = {id(x): v for x, v in zip(plan.graph.inputs, flat_inputs)}
        for stage, device in enumerate(self.devices):
            inputs = [values[i] for i in plan.needs[stage]]
            forward = self._stage_forward(stage, training)
            # The outer scope also places the IdentityN that wraps the
            # custom gradient, so activations go straight on.
            with tf.name_scope(f"stage{stage}"), tf.device(device):
                outputs = replicas._on_device(device, forward, inputs)
            values.update(zip(plan.exports[stage], outputs))
        return [values[id(x)] for x in plan.graph.outputs]

    def call(self, inputs, training=None):
        flat = keras.tree.flatten(inputs)
        if self.microbatches == 1:
            merged = self._run(flat, training)
        else:
            with tf.device(HOST_DEVICE):
                bounds = replicas.split_bounds(
                    tf.shape(flat[0])[0], self.microbatches
                )
            outputs = []
            for m in range(self.microbatches):
                with tf.device(HOST_DEVICE):
                    part = [x[bounds[m]:bounds[m + 1]] for x in flat]
                with tf.name_scope(f"microbatch{m}"):
                    outputs.append(self._run(part, training))
            with tf.device(self.devices[-1]):
                merged = [tf.concat(parts, axis=0) for parts in zip(*outputs)]
        return keras.tree.pack_sequence_as(self._plan.graph.output, merged)

    def compute_output_spec(self, inputs, training=None):
        return self.template.compute_output_spec(inputs)

    def get_config(self):
        config = super().get_config()
        config.update(
            template=keras.saving.serialize_keras_object(self.template),
            devices=self.devices,
            stages=self.stages,
            microbatches=self.microbatches,
        )
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        template = keras.saving.deserialize_keras_object(
            config.pop("template"), custom_objects=custom_objects
        )
        return cls(template, **config)


# ---------------------------------------------------------------------------
# Weights on their stage's device.


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
        for layer in _staged_layers(placed) for v in layer.weights
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


def variable_device(variable):
    """Canonical device of a Keras or TensorFlow variable."""
    handle = getattr(variable, "value", variable)
    return devices_lib.canonical_device_name(
        "/device:" + handle.device.rsplit("/device:", 1)[-1]
    )


# ---------------------------------------------------------------------------
# The model.


@keras.saving.register_keras_serializable(package="multigpu")
class PartitionedModel(replicas.TemplateBacked, keras.Model):
    """A Keras model that runs `template` as stages on several devices.

    Use it exactly like the template: `compile`, `fit`, `evaluate`,
    `predict`. Its weights are the template's, which live on the stage
    devices. `save`, `save_weights` and `load_weights` act on `template`, so
    files are plain Keras models that load with `keras.models.load_model`.
    """

    parallelism = "model parallelism"

    def __init__(self, template, devices, stages, microbatches=1, **kwargs):
        inputs = keras.tree.map_structure(
            lambda x: _input_like(x, microbatches), _graph_of(template).input
        )
        layer = Stages(template, devices, stages, microbatches, name="stages")
        outputs = replicas._named_like(_graph_of(template), layer(inputs))
        kwargs.setdefault("name", f"{template.name}_partitioned")
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

    @property
    def stages_layer(self):
        return next(layer for layer in self.layers if isinstance(layer, Stages))

    @property
    def template(self):
        """The model whose layers the stages run (weights on stage devices)."""
        return self.stages_layer.template

    @property
    def devices(self):
        """Canonical device names, one per stage."""
        return list(self.stages_layer.devices)

    @property
    def stages(self):
        """The layer names of each stage, in stage order."""
        return [list(names) for names in self.stages_layer.stages]

    @property
    def microbatches(self):
        """Number of micro-batches each batch is pipelined as."""
        return self.stages_layer.microbatches

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
                "variable_bytes": _variable_bytes(variables),
            })
        return rows

    def get_config(self):
        return {
            "name": self.name,
            "template": keras.saving.serialize_keras_object(self.template),
            "devices": self.devices,
            "stages": self.stages,
            "microbatches": self.microbatches,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        template = keras.saving.deserialize_keras_object(
            config.pop("template"), custom_objects=custom_objects
        )
        devices = devices_lib.resolve_devices(config.pop("devices"))
        placed = place_template(template, config["stages"], devices)
        return cls(placed, devices, **config)


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
        name=replicas._layer_name(tensor),
    )


def _check_microbatches(microbatches):
    if not devices_lib._is_int(microbatches) or int(microbatches) < 1:
        raise ValueError(
            f"Invalid `microbatches`: received {literal(microbatches)}; expected an "
            "int >= 1 (1: no pipelining; k: each batch runs as k "
            "micro-batches that overlap across stages)."
        )
    return int(microbatches)


def _resolve_model_devices(devices, split):
    if devices is None and isinstance(split, (list, tuple)) and split:
        if all(_is_group(entry) for entry in split):
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
        `.stages` and `.stage_table()`. Its `save`/`save_weights` write the
        template, which loads back with plain `keras.models.load_model`.

    Raises:
        ValueError: for devices that do not exist, more stages than layers,
            unknown layer names or indices in `split`, a split where the
            model cannot be cut (the message says why), or an invalid
            `microbatches`.
        TypeError: if `model` is not a `keras.Model` or `split` not a list.

    Example:
    >>> partitioned = multigpu.model_parallel(model, devices=4)
    >>> partitioned.stages          # layer names per device
    >>> partitioned.compile(optimizer="adam", loss="mse")
    >>> partitioned.fit(x, y, batch_size=64)
    >>> partitioned.save("model.keras")   # a plain Keras model
    """
    _graph_of(model)
    microbatches = _check_microbatches(microbatches)
    devices = _resolve_model_devices(devices, split)
    stages = resolve_stages(model, len(devices), split)
    _Plan(model, stages, devices)  # reject uncuttable splits before copying
    template = place_template(model, stages, devices)
    return PartitionedModel(template, devices, stages, microbatches)
