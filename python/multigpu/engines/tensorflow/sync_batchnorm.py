"""`sync_batchnorm`: BatchNormalization over the whole batch, on both engines.

By default every replica of `multi_gpu_model` normalises its own share of
the batch, as Keras 2's `multi_gpu_model` did. With `sync_batchnorm=True`
each BatchNormalization layer in training takes its mean and variance over
the rows of every replica, so a step equals the template's on the whole
batch, moving statistics included.

The statistics are pooled the same way on both engines
(`pooled_moments`): each replica sums its rows, the sums are added, and the
variance is taken around the pooled mean, as `tf.nn.moments` takes it
around the mean on one device. Shares of different sizes weigh by their
rows.

- The mirrored engine's replicas run in a replica context of its
  strategy: the copy's BatchNormalization layers add their sums with one
  all-reduce each (`synchronize`). A replica whose share is empty still
  runs the forward pass (on one row of zeros that the statistics leave
  out, `forward.padded_on_empty_share`), so it joins every all-reduce; a `tf.cond`
  around it would refuse them.
- The replicate engine runs the template once per device, so no layer
  sees another replica's rows. `GlobalBatchWalk` runs the template's graph
  in segments cut at its BatchNormalization nodes instead, each segment
  once per device on that device's share; at a BatchNormalization node it
  pools the shares' statistics, normalises each share with them and
  updates the moving statistics once. A model
  whose BatchNormalization layers sit inside code (a subclassed model or
  layer) cannot be walked (`walk_problem`); the mirrored engine takes it.
"""

import contextlib

import keras
import tensorflow as tf

from multigpu import internals
from multigpu.arguments import check_flag
from multigpu.engines.functional import (
    call_arguments,
    callable_graph,
    execution_order,
    symbolic_graph,
)
from multigpu.engines.tensorflow.device_pass import on_device
from multigpu.engines.tensorflow.forward import (
    PassLayout,
    concat_with_logits,
    held_effects,
    rows_weighted_loss,
    valid_rows,
)
from multigpu.messages import literal, literals, setting


def check_sync_batchnorm(value):
    """Validates the `sync_batchnorm` argument of `multi_gpu_model`.

    Args:
        value: What the user passed.

    Returns:
        `True` or `False`.

    Raises:
        ValueError: if `value` is not a bool (NumPy bools and R's `TRUE` and
            `FALSE` are).

    Example:
    >>> check_sync_batchnorm(np.bool_(True))
    True
    """
    try:
        return check_flag("sync_batchnorm", value)
    except ValueError:
        raise ValueError(
            f"Invalid `sync_batchnorm`: received {literal(value)}; expected "
            f"{literals([True, False])}. Pass {setting('sync_batchnorm', True)} "
            "for BatchNormalization statistics over the whole batch (a step "
            "equals the template's), or "
            f"{setting('sync_batchnorm', False)} (the default) for statistics "
            "over each replica's share."
        ) from None


def batch_norm_layers(model):
    """The BatchNormalization layers of `model`, at any depth."""
    return [layer for layer in [model, *internals.nested_layers(model)]
            if isinstance(layer, keras.layers.BatchNormalization)]


def _check_supported(layer):
    """Refuses a BatchNormalization layer whose statistics cannot be pooled."""
    if layer.renorm:
        raise ValueError(
            f"Invalid `model` for {setting('sync_batchnorm', True)}: "
            f"BatchNormalization layer {literal(layer.name)} uses "
            f"{setting('renorm', True)}, whose corrections are not pooled "
            f"across replicas. Leave {setting('sync_batchnorm', False)} or "
            "build the layer without renorm."
        )


def _masked(layer):
    return ValueError(
        f"Invalid input for {setting('sync_batchnorm', True)}: "
        f"BatchNormalization layer {literal(layer.name)} received a mask, "
        "whose rows are not pooled across replicas. Leave "
        f"{setting('sync_batchnorm', False)} for this model."
    )


def pooled_moments(shares, axes, pool):
    """Mean and variance over the rows of every share, as on one device.

    Each share contributes its sum and row count (one tensor, so the pool
    runs once), then its sum of squares around the pooled mean. The
    variance is the mean square around a mean whose gradient is stopped,
    as `tf.nn.moments` computes it.

    Args:
        shares: `[(device, x)]`: each replica's input to the layer, float,
            with its device (None: the current one).
        axes: The axes reduced (every axis but the features').
        pool: Adds a list of per-share tensors of one shape: `tf.add_n`
            in one graph, an all-reduce across a strategy's replicas.

    Returns:
        `(mean, variance)`, shaped as the features (the axes left out).

    Example:
    >>> x = tf.random.normal((10, 3))
    >>> mean, variance = pooled_moments(
    ...     [(None, x[:6]), (None, x[6:])], [0], tf.add_n)
    """
    sums = []
    for device, x in shares:
        with _device(device):
            total = tf.reduce_sum(x, axes, keepdims=True)
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)),
                            x.dtype)
            sums.append(tf.concat([tf.reshape(total, [-1]), [count]], 0))
    kept_shape = total.shape
    pooled = pool(sums)
    mean = tf.reshape(
        tf.math.divide_no_nan(pooled[:-1], pooled[-1]), kept_shape)
    centred = tf.stop_gradient(mean)
    squares = []
    for device, x in shares:
        with _device(device):
            squares.append(tf.reduce_sum(
                tf.math.squared_difference(x, centred), axes, keepdims=True))
    variance = tf.math.divide_no_nan(pool(squares), pooled[-1])
    features = [d for i, d in enumerate(kept_shape) if i not in axes]
    return tf.reshape(mean, features), tf.reshape(variance, features)


def _device(device):
    return tf.device(device) if device else contextlib.nullcontext()


# The mirrored engine: BatchNormalization layers pool through the strategy.


def _replica_moments(layer, inputs, mask=None):
    """A copy's BatchNormalization moments, pooled across the replicas."""
    if mask is not None:
        raise _masked(layer)
    rows = valid_rows.get()
    own = inputs if rows is None else inputs[:rows]
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        pool = tf.add_n
    else:
        def pool(parts):
            return context.all_reduce(tf.distribute.ReduceOp.SUM,
                                      tf.add_n(parts))
    return pooled_moments([(None, own)],
                          internals.batch_norm_reduction_axes(layer), pool)


def synchronize(model):
    """Makes the BatchNormalization layers of an engine's copy pool.

    For the mirrored engine's copy only (never a user's model): each
    layer's moments are replaced by `pooled_moments` over an all-reduce of
    the replicas' sums. Keras's own `synchronized=True` weighs rows alike
    but counts every row of the tensor it gets, and needs every replica to
    have rows; here the row of zeros of an empty share is left out.

    Args:
        model: The copy, built under the strategy.

    Raises:
        ValueError: for a layer with `renorm=True`.
    """
    for layer in batch_norm_layers(model):
        _check_supported(layer)
        internals.replace_moments(
            layer, lambda inputs, mask=None, layer=layer: _replica_moments(
                layer, inputs, mask))


# The replicate engine: the template's graph, node by node across replicas.


def _walkable(model):
    """Whether `model` is a graph of layers (functional or Sequential)."""
    return isinstance(model, keras.Model) and (
        internals.is_functional(model)
        or internals.functional_graph_of(model) is not None)


def walk_problem(model):
    """Why the replicate engine cannot pool `model`'s statistics, or None.

    Its BatchNormalization layers must be nodes of the model's graph, or of
    graphs nested in it (functional and Sequential models); one inside a
    subclassed model or layer runs inside code the walk cannot enter.

    Args:
        model: A built Keras model.

    Returns:
        None, or one clause naming the model or layer that hides them.
    """
    if not _walkable(model):
        if not batch_norm_layers(model):
            return None
        return (f"{literal(model.name)} is a subclassed model, whose call() "
                "is code rather than a graph of layers")
    return _hidden_batch_norm(model)


def _hidden_batch_norm(graph_model):
    """`walk_problem` of a functional or Sequential model, at any depth."""
    for layer in graph_model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            continue
        if _walkable(layer):
            problem = _hidden_batch_norm(layer)
            if problem:
                return problem
        elif batch_norm_layers(layer):
            return (f"its layer {literal(layer.name)} holds "
                    "BatchNormalization layers inside code (a subclassed "
                    "layer or model)")
    return None


class GlobalBatchWalk:
    """The template run segment by segment across replicas, BN over all rows.

    The template's graph is cut at its BatchNormalization nodes; each
    segment between them runs once per device on that device's share, as
    one `device_pass.on_device` function (its backward pass on the device);
    functional and Sequential models nested in it that hold
    BatchNormalization are walked the same way. A BatchNormalization node in
    training pools the shares' statistics (`pooled_moments`, added on the
    merge device), normalises each share with them on its device and
    updates the moving statistics once, as the template's layer does on
    the whole batch. Gradients flow through the walk as through the
    template.

    Args:
        template: A functional or Sequential model (see `walk_problem`).
        merge_device: Where the shares' sums are added.

    Example:
    >>> walk = GlobalBatchWalk(model, "/device:CPU:0")
    >>> outputs = walk(devices, [[x[:5]], [x[5:]]], training=True)
    """

    def __init__(self, template, merge_device):
        self.graph = callable_graph(template)
        self.merge_device = merge_device
        for layer in batch_norm_layers(template):
            _check_supported(layer)

    def __call__(self, devices, shares, training):
        """Runs the template on every share.

        Args:
            devices: One device per share.
            shares: Per replica, its flat inputs (the template's `inputs`
                order).
            training: The `training` argument of the layers.

        Returns:
            `(outputs, loss)`: the merged flat outputs, logits re-attached
            (see `forward.with_logits`), and the layer-made loss of the
            whole batch (`forward.rows_weighted_loss`), or None when the
            layers add none.
        """
        losses = [[] for _ in shares]
        outputs = self._run(self.graph, devices, shares, training, losses)
        with tf.device(self.merge_device):
            merged = [concat_with_logits(parts) for parts in zip(*outputs)]
            if not any(losses):
                return merged, None
            rows = [tf.shape(flat[0])[0] for flat in shares]
            bounds = [0]
            for count in rows:
                bounds.append(bounds[-1] + count)
            return merged, rows_weighted_loss(
                [tf.add_n(share) for share in losses], bounds)

    def _run(self, graph, devices, shares, training, losses):
        values = [{id(x): v for x, v in zip(graph.inputs, flat)}
                  for flat in shares]
        segments = _segments(graph, training)
        for (kind, nodes), later in zip(segments, _read_later(graph, segments)):
            if kind == "batch_norm":
                results = self._batch_norm(nodes[0], devices, values)
            elif kind == "nested":
                results = self._nested(nodes[0], devices, values, training,
                                       losses)
            else:
                results = _segment_on_devices(nodes, later, devices, values,
                                              training, losses)
            for known, result in zip(values, results):
                known.update(result)
        return [[known[id(x)] for x in graph.outputs] for known in values]

    def _nested(self, node, devices, values, training, losses):
        """Walks a nested functional or Sequential model's graph."""
        graph = symbolic_graph(node.operation)
        shares = []
        for known in values:
            args, _ = node.arguments.fill_in(known)
            shares.append(keras.tree.flatten(args[0]))
        outputs = self._run(graph, devices, shares, training, losses)
        return [dict(zip((id(x) for x in node.outputs), flat))
                for flat in outputs]

    def _batch_norm(self, node, devices, values):
        layer = node.operation
        inputs = []
        for known in values:
            args, kwargs = call_arguments(node, known, None)
            x = args[0]
            if kwargs.get("mask") is not None or (
                    internals.keras_mask(x) is not None):
                raise _masked(layer)
            inputs.append(x)
        outputs = _normalised_together(layer, devices, inputs,
                                       self.merge_device)
        return [{id(node.outputs[0]): y} for y in outputs]


def _segments(graph, training):
    """The graph's nodes in order, cut at the nodes that pool statistics.

    Returns:
        `[(kind, nodes)]`: `"batch_norm"` (a BatchNormalization layer in
        training) and `"nested"` (a functional or Sequential model holding
        one) with one node each; `"plain"` with the nodes between them,
        which each replica runs as one function on its device.
    """
    segments = []
    for node in execution_order(graph):
        layer = node.operation
        if isinstance(layer, keras.layers.BatchNormalization) and (
                training and layer.trainable):
            segments.append(("batch_norm", [node]))
        elif _walkable(layer) and batch_norm_layers(layer):
            segments.append(("nested", [node]))
        elif segments and segments[-1][0] == "plain":
            segments[-1][1].append(node)
        else:
            segments.append(("plain", [node]))
    return segments


def _read_later(graph, segments):
    """Per segment, the ids of the tensors read after it (or output)."""
    read = {id(x) for x in graph.outputs}
    later = []
    for _, nodes in reversed(segments):
        later.append(set(read))
        read.update(id(x) for node in nodes for x in node.input_tensors)
    return later[::-1]


def _segment_on_devices(nodes, later, devices, values, training, losses):
    """Runs consecutive plain nodes on each replica's share, on its device.

    Each replica's part is one `device_pass.on_device` function, so its
    backward pass runs on its device too (the tape would put it on one
    device). Its inputs are the tensors the nodes read from before the
    segment; its outputs those read after it (`later`), with the logits
    Keras attached to them.

    The losses the nodes add (`add_loss`, `activity_regularizer`) leave
    each replica's function as an output too, appended to the replica's
    list in `losses`; what the nodes write is committed after each
    replica's function, as the layers would have written it.

    Returns:
        Per replica, `{id(symbolic tensor): tensor}` of the outputs.

    Raises:
        ValueError: if a Keras mask would leave the segment (a custom
            gradient's outputs carry none).
    """
    inside = {id(x) for node in nodes for x in node.outputs}
    needed = list(dict.fromkeys(
        id(x) for node in nodes for x in node.input_tensors
        if id(x) not in inside))
    exports = [id(x) for node in nodes for x in node.outputs
               if id(x) in later]
    results = []
    for device, known, own in zip(devices, values, losses):
        layout = PassLayout()
        forward = _segment_function(nodes, needed, exports, training,
                                    layout)
        outputs, loss, new_values = layout.split(
            on_device(device, forward, [known[i] for i in needed]))
        layout.commit(new_values)
        if loss is not None:
            own.append(loss)
        results.append(dict(zip(exports, outputs)))
    return results


def _segment_function(nodes, needed, exports, training, layout):
    """The nodes as a function of flat tensors: `needed` in, `exports` out.

    Its outputs are those of a `forward.flat_forward` function; `layout`
    (a `forward.PassLayout`) receives, when the function is traced, where
    the exports' logits, the loss and the written values are.
    """

    def forward(*inputs):
        local = dict(zip(needed, inputs))
        with held_effects() as held:
            for node in nodes:
                args, kwargs = call_arguments(node, local, training)
                outputs = keras.tree.flatten(node.operation(*args, **kwargs))
                local.update(zip((id(x) for x in node.outputs), outputs))
        ys = [local[i] for i in exports]
        if any(internals.keras_mask(y) is not None for y in ys):
            raise ValueError(
                f"Invalid `model` for {setting('sync_batchnorm', True)} with "
                f"{setting('engine', 'replicate')}: a Keras mask (e.g. from "
                f"{setting('mask_zero', True)}) reaches a BatchNormalization "
                "layer or a later part of the model, and the walk across "
                f"replicas does not carry masks. Use "
                f"{setting('engine', 'mirrored')}.")
        return layout.flat(ys, held)

    return forward


def _normalised_together(layer, devices, inputs, merge_device):
    """`layer` in training on every share, with the pooled statistics.

    What `keras.layers.BatchNormalization.call` does on one batch, with
    the batch's moments pooled from the shares.
    """
    dtype = keras.backend.result_type(inputs[0].dtype, "float32")
    inputs = [keras.ops.cast(x, dtype) for x in inputs]

    def pool(parts):
        with tf.device(merge_device):
            return tf.add_n(parts)

    mean, variance = pooled_moments(
        list(zip(devices, inputs)),
        internals.batch_norm_reduction_axes(layer), pool)
    momentum = layer.momentum
    moving_mean = keras.ops.cast(layer.moving_mean, dtype)
    moving_variance = keras.ops.cast(layer.moving_variance, dtype)
    layer.moving_mean.assign(moving_mean * momentum + mean * (1.0 - momentum))
    layer.moving_variance.assign(
        moving_variance * momentum + variance * (1.0 - momentum))
    gamma = keras.ops.cast(layer.gamma, dtype) if layer.scale else None
    beta = keras.ops.cast(layer.beta, dtype) if layer.center else None
    outputs = []
    for device, x in zip(devices, inputs):
        with tf.device(device):
            y = keras.ops.batch_normalization(
                x, mean, variance, axis=layer.axis, offset=beta, scale=gamma,
                epsilon=layer.epsilon)
            outputs.append(keras.ops.cast(y, layer.compute_dtype))
    return outputs
