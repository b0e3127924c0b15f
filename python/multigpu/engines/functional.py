"""A model as a functional graph: what wrapping it in another model needs.

`callable_graph` gives any built model (Sequential, functional or
subclassed) a graph with symbolic inputs and outputs; `output_names` and
`outputs_named_after` give a wrapper's outputs the names of the model's, so
loss and metric dicts keyed by them work unchanged. `execution_order` and
`call_arguments` walk such a graph node by node (the pipeline's stages and
`sync_batchnorm`'s walk across replicas run it that way).
"""

import keras

from multigpu import internals
from multigpu.messages import api, literal


def layer_name(tensor):
    return internals.producing_operation(tensor).name


def batch_input_like(tensor):
    """A `keras.Input` like a model's input `tensor`, whose batch size is free.

    The inputs of a model that splits each batch between devices.

    Raises:
        ValueError: if `tensor` has a fixed batch size.

    Example:
    >>> batch_input_like(keras.Input((3,), name="x")).shape
    (None, 3)
    """
    if tensor.shape[0] is not None:
        raise ValueError(
            f"Invalid `model`: its input {literal(tensor.name)} has a fixed batch "
            f"size ({tensor.shape}); multi_gpu_model slices each batch, so "
            "build the model with shape=... rather than batch_shape=..."
        )
    return keras.Input(
        shape=tensor.shape[1:], dtype=tensor.dtype, sparse=tensor.sparse,
        name=layer_name(tensor),
    )


def unique_names(names):
    """The names with repeats made unique, as Keras 2 named its outputs.

    The first use of a name keeps it; a repeat gets the first free
    `name_1`, `name_2`, ... (a siamese model's outputs `["add", "nested",
    "nested"]` become `["add", "nested", "nested_1"]`).

    Example:
    >>> unique_names(["add", "nested", "nested"])
    ['add', 'nested', 'nested_1']
    """
    taken = set(names)
    seen, result = set(), []
    for name in names:
        unique, count = name, 0
        while unique in seen or (unique != name and unique in taken):
            count += 1
            unique = f"{name}_{count}"
        seen.add(unique)
        taken.add(unique)
        result.append(unique)
    return result


def output_names(graph):
    """Unique names of `graph`'s outputs (see `unique_names`)."""
    return unique_names(
        [layer_name(t) for t in keras.tree.flatten(graph.output)])


def outputs_named_after(graph, outputs):
    """A wrapper's `outputs`, each named after its output of `graph`.

    `outputs` are new tensors (a wrapping layer's) in the structure of
    `graph`'s outputs; each gets the name of the template's output it
    stands for, so loss and metric dicts keyed by those names work.

    Outputs that share a layer name (a shared sub-model's output used
    twice) are named apart, since a Keras model's output names are unique
    keys of its loss and metric dicts. The renaming layers cast nothing
    (`autocast=False`): each output keeps its dtype under any global dtype
    policy.
    """
    input_names = {layer_name(t) for t in keras.tree.flatten(graph.input)}
    original = [layer_name(t) for t in keras.tree.flatten(graph.output)]
    flat = [
        o if name == first and name in input_names
        else keras.layers.Identity(name=name, autocast=False)(o)
        for o, name, first in zip(keras.tree.flatten(outputs),
                                  unique_names(original), original)
    ]
    return keras.tree.pack_sequence_as(graph.output, flat)


def _is_shape(value):
    return isinstance(value, (list, tuple)) and all(
        d is None or isinstance(d, int) for d in value)


def _inputs_for_shapes(shapes):
    """Symbolic inputs, any batch size, for a structure of built shapes."""
    if _is_shape(shapes):
        return keras.Input(shape=tuple(shapes[1:]))
    if isinstance(shapes, dict):
        return {k: keras.Input(shape=tuple(v[1:]), name=k)
                for k, v in shapes.items()}
    return [_inputs_for_shapes(s) for s in shapes]


def _unbuilt_error(model, kind):
    return ValueError(
        f"Invalid `model`: {kind} {literal(model.name)} has not been built, "
        "so the shapes of its inputs are unknown and no replica can be "
        "built. Call it once on a batch of your data first "
        "(`model(x[:1])`), call `model.build(input_shape)`, or start it with "
        "keras.Input(shape=...)."
    )


def callable_graph(model):
    """A functional graph that computes `model`, for wrapping it in another.

    Sequential and functional models are their own graph. A subclassed
    model, whose `call` is Python code, is wrapped: one functional model
    that calls it on symbolic inputs made from the shapes it was built with
    (any batch size). So is a Sequential model built by a call on a batch
    (without `keras.Input`), whose graph has that batch's size. The wrapper
    shares the model's weights.

    Args:
        model: A built `keras.Model`.

    Returns:
        An object with the `input`, `output`, `inputs` and `outputs` of a
        functional model.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ValueError: if `model` was never built (called or `build()`), so its
            input shapes are unknown.

    Example:
    >>> model = MySubclassedModel(); model(x[:1])
    >>> callable_graph(model).output_names
    """
    sequential = isinstance(model, keras.Sequential)
    try:
        graph = symbolic_graph(model)
    except ValueError:
        if sequential or not model.built:
            kind = "Sequential model" if sequential else "subclassed model"
            raise _unbuilt_error(model, kind) from None
    else:
        # A Sequential model built by a call on a batch fixed that batch's
        # size; called as a whole, it takes any batch size.
        if not (sequential and any(
                t.shape[0] is not None for t in keras.tree.flatten(graph.input))):
            return graph
    shapes = (model.get_build_config() or {}).get("input_shape")
    if shapes is None:
        raise _unbuilt_error(model, "subclassed model")
    inputs = _inputs_for_shapes(shapes)
    return keras.Model(inputs, model(inputs), name=model.name)


def symbolic_graph(model):
    """The functional graph of a built Sequential or functional model.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ValueError: if it has no symbolic inputs (unbuilt or subclassed).
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `model`: received an object of type "
            f"{type(model).__name__}; expected a keras.Model (Sequential or "
            "functional)."
        )
    graph = internals.functional_graph_of(model) or model
    try:
        _ = graph.input, graph.output
    except (AttributeError, ValueError):
        raise ValueError(
            f"Invalid `model`: {literal(model.name)} has no symbolic "
            "inputs: it is a subclassed model, whose call() is code rather "
            "than a graph of layers, or a Sequential model that was never "
            "built. Build it with keras.Input(...) (Sequential: start with "
            "keras.Input(shape=...)) or as a functional model; "
            f"{api('multi_gpu_model')} also takes built subclassed models."
        ) from None
    return graph


def execution_order(graph):
    """The graph's computing nodes in an order that respects their inputs.

    Args:
        graph: A functional graph (see `symbolic_graph`).

    Returns:
        A list of Keras nodes, input layers left out; a node comes after
        every node whose output it reads.
    """
    ready = {id(x) for x in graph.inputs}
    order = []
    by_depth = internals.nodes_by_depth(graph)
    for depth in sorted(by_depth, reverse=True):
        for node in by_depth[depth]:
            if not node.operation or node.is_input:
                continue
            if any(id(x) not in ready for x in node.input_tensors):
                continue
            order.append(node)
            ready.update(id(x) for x in node.outputs)
    return order


def call_arguments(node, values, training):
    """The `(args, kwargs)` that call `node`'s operation on `values`.

    Args:
        node: A node of a functional graph.
        values: `{id(symbolic tensor): tensor}` for at least the node's
            inputs.
        training: The `training` argument, passed to operations that take
            one (None: left to them).
    """
    args, kwargs = node.arguments.fill_in(values)
    if training is not None and internals.takes_training_argument(
            node.operation):
        kwargs["training"] = training
    return args, kwargs
