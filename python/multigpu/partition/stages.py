"""Which layers form each stage of a partitioned model.

The pure part of `model_parallel`: the top-level layers of a model are cut
into consecutive stages, balanced by the bytes of their weights or where the
user says. Nothing here touches a device.
"""

import keras

from multigpu import internals
from multigpu.arguments import is_int
from multigpu.messages import api, literal, setting
from multigpu.variables import variable_bytes

_MAX_NAMES_SHOWN = 30


def staged_layers(model):
    """The model's top-level layers that belong to a stage, in model order."""
    return [
        layer for layer in model.layers
        if not isinstance(layer, keras.layers.InputLayer)
    ]


def _layer_bytes(layers):
    """Bytes of each layer's weights, each variable counted once."""
    seen = set()
    sizes = []
    for layer in layers:
        fresh = [v for v in layer.weights if id(v) not in seen]
        seen.update(id(v) for v in fresh)
        sizes.append(sum(variable_bytes(v) for v in fresh))
    return sizes


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
    for layer in staged_layers(model):
        if any(sub.name == name for sub in internals.nested_layers(layer)):
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
    if is_int(entry):
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


def is_group(entry):
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
    layers = staged_layers(model)
    if num_stages > len(layers) and len(layers) < 2:
        raise ValueError(
            f"Invalid `model`: {literal(model.name)} has {len(layers)} layer(s) "
            f"{_names_hint(layers)}, and model parallelism cuts a model "
            "between its layers, one stage per device: it needs at least 2 "
            "layers. Train this model on one device, or replicate it with "
            f"{api('multi_gpu_model', 'model')} (data parallelism)."
        )
    if num_stages > len(layers):
        raise ValueError(
            f"Invalid `devices`: {num_stages} stages (one per device) for "
            f"{literal(model.name)}, which has only {len(layers)} layer(s) "
            f"{_names_hint(layers)}. Use at most {len(layers)} devices, e.g. "
            f"{setting('devices', len(layers))}."
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
    if split and all(is_group(entry) for entry in split):
        return _stages_from_sets(model, layers, split, num_stages)
    if any(is_group(entry) for entry in split):
        raise TypeError(
            f"Invalid `split`: received {literal(split)}, which mixes layer lists "
            "with single layers; use either start points or one list per "
            "stage."
        )
    return _stages_from_starts(model, layers, list(split), num_stages)
