"""`multi_gpu_model`: replica-slicing data parallelism for Keras 3.

Each batch is cut into one contiguous sub-batch per device, the template
model runs once per device on its sub-batch, and the outputs are concatenated
along the batch axis. The replicas are calls of the template itself, so they
share its weights: training the parallel model trains the template.
"""

import contextlib
import inspect
import warnings

import keras
import tensorflow as tf

from multigpu import devices as devices_lib
from multigpu import gradients as gradients_lib
from multigpu import mirrored, saving, scaling
from multigpu.arguments import check_flag
from multigpu.messages import api, literal, setting

HOST_DEVICE = "/device:CPU:0"


def split_bounds(batch_size, num_replicas):
    """Row boundaries of the sub-batches: `num_replicas + 1` offsets.

    Sub-batch `i` is rows `bounds[i]:bounds[i + 1]`. Sizes differ by at most
    one row and no row is lost; with fewer rows than
    replicas the first replicas get empty sub-batches. Works on Python ints
    and on scalar tensors.

    Example:
    >>> split_bounds(10, 4)
    [0, 2, 5, 7, 10]
    """
    return [(i * batch_size) // num_replicas for i in range(num_replicas + 1)]


def _is_zeros(tensor):
    """Whether `tensor` is the all-zeros gradient the tape gives unused outputs."""
    op = tensor.op
    if op.type == "ZerosLike":
        return True
    if op.type in ("Fill", "Const"):
        value = tf.get_static_value(op.inputs[1] if op.type == "Fill" else tensor)
        return value is not None and not value.any()
    return False


def _differentiable_on(device, forward, flat_inputs):
    """Runs `forward(*flat_inputs)` on `device`, its gradient there too.

    TensorFlow 2's tape places every backward op on the default device, which
    would run all replicas' backward passes on one device. `tf.gradients`
    colocates each gradient op with its forward op, so the backward pass of a
    replica stays on the replica's device. Outputs whose gradient is the
    tape's all-zeros filler (no loss uses them, or the loss uses their
    logits instead) are left out of the backward pass rather than
    differentiated as zeros.
    """

    @tf.custom_gradient
    def replica(*xs):
        with tf.device(device):
            ys = forward(*xs)

        def grad(*dys, variables=None):
            variables = list(variables or [])
            sources = list(xs) + variables
            used = [(y, dy) for y, dy in zip(ys, dys)
                    if dy is not None and not _is_zeros(dy)]
            if not used:
                return [None] * len(xs), [None] * len(variables)
            # Each input is a separate source: with one input computed
            # from another (a stem feeding this stage both directly and
            # through an earlier stage), `tf.gradients` would otherwise also
            # differentiate through that earlier stage, whose own gradient
            # function counts the same path again.
            grads = tf.gradients([y for y, _ in used], sources,
                                 grad_ys=[dy for _, dy in used],
                                 stop_gradients=list(xs))
            return grads[: len(xs)], grads[len(xs):]

        return ys, grad

    return replica(*flat_inputs)


def _on_device(device, forward, flat_inputs):
    """`forward(*flat_inputs)` on `device`, backward pass there too in graphs."""
    if tf.executing_eagerly():
        # `tf.gradients` needs a graph; eager runs are for debugging.
        with tf.device(device):
            return forward(*flat_inputs)
    return _differentiable_on(device, forward, flat_inputs)


def forward_only_when_empty(forward, inference_fn):
    """Guards a function of a batch against batches of zero rows.

    Returns a function of the same inputs that runs `forward` when the first
    input has rows. On zero rows it runs `inference_fn` on one row of zeros
    instead and returns its outputs cut to zero rows, with no gradient.
    Kernels fail on zero rows (oneDNN: MaxPoolGrad aborts the process, a
    convolution after MaxPooling reports "input depth must be evenly
    divisible by filter depth") and training mode would feed
    BatchNormalization NaN statistics; inference on one row has no side
    effects.

    Args:
        forward: A function of flat input tensors to a list of tensors.
        inference_fn: The same computation in inference mode.
    """

    def on_no_rows(rows, *inputs):
        outputs = inference_fn(*[_one_row_of_zeros(x) for x in inputs])
        # `rows` (zero) rather than 0 keeps the batch size unknown in the
        # graph, as the other branch's.
        return [tf.stop_gradient(y[:rows]) for y in outputs]

    def guarded(*inputs):
        rows = tf.shape(inputs[0])[0]
        if inputs[0].shape[0] == 0:
            # Known to be empty (a replica's share of a batch with fewer
            # rows than replicas): tracing `forward` on a static batch of 0
            # would also trip Keras 3.15's `ops.add`, which takes a
            # (0, n) tensor for a bias and emits an invalid BiasAdd.
            return on_no_rows(rows, *inputs)
        return tf.cond(
            rows > 0,
            lambda: forward(*inputs),
            lambda: on_no_rows(rows, *inputs),
        )

    return guarded


def _one_row_of_zeros(tensor):
    shape = tf.concat([[1], tf.shape(tensor)[1:]], axis=0)
    if tensor.dtype == tf.string:
        return tf.fill(shape, "")
    return tf.zeros(shape, tensor.dtype)


def flat_forward(model, inputs_struct, training, logits_at, guard=True):
    """`model` as a function of flat inputs to flat outputs and their logits.

    Keras attaches to softmax and sigmoid outputs the logits they were
    computed from (`_keras_logits`), and its cross-entropy losses use them:
    exact and stable where log(clip(p)) is not. Concatenating outputs, or
    passing them through a `tf.cond`, would lose them, so the function also
    returns the logits; `logits_at` receives the indices of the outputs that
    have them (`with_logits` puts them back).

    Args:
        model: A callable Keras model or layer.
        inputs_struct: The structure of its inputs.
        training: The `training` argument of the calls.
        logits_at: A list, filled in when the function is traced.
        guard: Survive a batch of zero rows (see
            `forward_only_when_empty`).
    """

    def forward_in(mode):
        def forward(*flat):
            args = keras.tree.pack_sequence_as(inputs_struct, list(flat))
            ys = keras.tree.flatten(model(args, training=mode))
            logits = [getattr(y, "_keras_logits", None) for y in ys]
            logits_at[:] = [i for i, z in enumerate(logits) if z is not None]
            return ys + [logits[i] for i in logits_at]

        return forward

    if not guard:
        return forward_in(training)
    return forward_only_when_empty(forward_in(training), forward_in(False))


def with_logits(flat_outputs, logits_at):
    """The outputs of a `flat_forward` function, its logits re-attached."""
    values = list(flat_outputs[: len(flat_outputs) - len(logits_at)])
    for index, logits in zip(logits_at, flat_outputs[len(values):]):
        try:
            values[index]._keras_logits = logits
        except AttributeError:  # eager tensors take no attributes
            pass
    return values


class TemplateLayer(keras.layers.Layer):
    """A layer that runs a (compiled) template model inside another model."""

    @property
    def metrics(self):
        # The template's compiled metrics are the template's to report; the
        # outer model has its own, computed on the merged outputs.
        return []


class DataParallel(TemplateLayer):
    """Runs `template` once per device on a slice of the batch.

    Not usually built directly: `multi_gpu_model` wraps it in a model whose
    inputs and output names mirror the template's.

    Args:
        template: A built Keras model whose weights the replicas share.
        devices: Canonical device names, one replica per device.
        merge_device: Device on which the batch is sliced and the replica
            outputs concatenated.
    """

    def __init__(self, template, devices, merge_device=HOST_DEVICE, **kwargs):
        super().__init__(**kwargs)
        self.template = template
        self.devices = list(devices)
        self.merge_device = merge_device
        self._output_struct = callable_graph(template).output
        # (devices, guard) used by the next traced call; see `planned`.
        self._plan = None

    @contextlib.contextmanager
    def planned(self, devices, guard):
        """Traces calls in this block with `devices` and, if `guard`, guarded.

        A caller that knows a batch has at least one row per device
        (`ParallelModel`'s steps decide once per step) can drop the
        per-replica zero-row guard, whose `tf.cond` (and its gradient, in
        training) costs up to 15% of a step; it can also send a batch to
        one device.

        Args:
            devices: The devices of the replicas, a non-empty sublist of
                `self.devices`.
            guard: Whether each replica survives a sub-batch of zero rows
                (see `forward_only_when_empty`).
        """
        previous, self._plan = self._plan, (list(devices), guard)
        try:
            yield
        finally:
            self._plan = previous

    def call(self, inputs, training=None):
        devices, guard = self._plan or (self.devices, True)
        flat_inputs = keras.tree.flatten(inputs)
        logits_at = []
        forward = flat_forward(self.template, inputs, training, logits_at,
                               guard)
        if len(devices) == 1:
            # One device: nothing to slice or concatenate.
            merged = _on_device(devices[0], forward, flat_inputs)
        else:
            merged = self._replicated(forward, devices, flat_inputs)
        return keras.tree.pack_sequence_as(
            self._output_struct, with_logits(merged, logits_at))

    def _replicated(self, forward, devices, flat_inputs):
        """Slices the batch, runs `forward` once per device, concatenates."""
        with tf.device(self.merge_device):
            bounds = split_bounds(tf.shape(flat_inputs[0])[0], len(devices))
            slices = [
                [x[bounds[i]:bounds[i + 1]] for x in flat_inputs]
                for i in range(len(devices))
            ]
        outputs = [_on_device(device, forward, flat)
                   for device, flat in zip(devices, slices)]
        with tf.device(self.merge_device):
            return [tf.concat(parts, axis=0) for parts in zip(*outputs)]

    def compute_output_spec(self, inputs, training=None):
        return self.template.compute_output_spec(inputs)

    def get_config(self):
        config = super().get_config()
        config.update(
            template=keras.saving.serialize_keras_object(self.template),
            devices=self.devices,
            merge_device=self.merge_device,
        )
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        template = keras.saving.deserialize_keras_object(
            config.pop("template"), custom_objects=custom_objects
        )
        return cls(template, **config)


def _input_like(tensor):
    if tensor.shape[0] is not None:
        raise ValueError(
            f"Invalid `model`: its input {literal(tensor.name)} has a fixed batch "
            f"size ({tensor.shape}); multi_gpu_model slices each batch, so "
            "build the model with shape=... rather than batch_shape=..."
        )
    return keras.Input(
        shape=tensor.shape[1:], dtype=tensor.dtype, sparse=tensor.sparse,
        name=_layer_name(tensor),
    )


def _layer_name(tensor):
    return tensor._keras_history.operation.name


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
        [_layer_name(t) for t in keras.tree.flatten(graph.output)])


def _named_like(graph, outputs):
    """Gives each output its template output's name (so loss dicts work).

    Outputs that share a layer name (a shared sub-model's output used
    twice) are named apart, since a Keras model's output names are unique
    keys of its loss and metric dicts.
    """
    input_names = {_layer_name(t) for t in keras.tree.flatten(graph.input)}
    original = [_layer_name(t) for t in keras.tree.flatten(graph.output)]
    flat = [
        o if name == first and name in input_names
        else keras.layers.Identity(name=name)(o)
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
    graph = getattr(model, "_functional", None) or model
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


def _by_position(value, names):
    """A dict keyed by output names as a list in output order; else as is."""
    if isinstance(value, dict) and set(value) <= set(names):
        return [value.get(name) for name in names]
    return value


def template_compile_arguments(template, names, optimizer, args, kwargs):
    """The `compile` arguments of a wrapping model, for its template.

    Args:
        template: The template model.
        names: The wrapping model's (unique) output names.
        optimizer: The optimizer the template gets.
        args: Positional arguments of `compile` after `optimizer`.
        kwargs: Keyword arguments of `compile` (without `optimizer`).

    Returns:
        A dict of keyword arguments for `template.compile`. Where the
        template's outputs share names that the wrapper's have apart,
        dicts keyed by output name become lists in output order.

    Example:
    >>> template.compile(**template_compile_arguments(
    ...     template, parallel.output_names, parallel.optimizer, (), kwargs))
    """
    arguments = inspect.signature(keras.Model.compile).bind(
        template, optimizer, *args, **kwargs).arguments
    arguments.pop("self")
    arguments.update(arguments.pop("kwargs", {}))
    own = [_layer_name(t)
           for t in keras.tree.flatten(callable_graph(template).output)]
    if list(names) != own:
        for key in ("loss", "loss_weights", "metrics", "weighted_metrics"):
            if key in arguments:
                arguments[key] = _by_position(arguments[key], names)
    return arguments


class TemplateBacked:
    """Compiling and saving for models whose weights are `self.template`'s.

    `compile` compiles the template alike, sharing the optimizer; `save`,
    `save_weights` and `load_weights` act on the template, so files are plain
    Keras models. Shared by `ParallelModel` and `PartitionedModel`.
    """

    parallelism = "the device placement"

    def compile(self, *args, jit_compile=False, **kwargs):
        """Compiles like `keras.Model.compile`, and the template alike.

        The template is (re)compiled with the same loss and metrics and
        shares this model's optimizer, the one that trains the shared
        weights: saved files then carry the compile configuration and the
        optimizer state that training produced (even when the template had
        been compiled before), and `template.evaluate` works after training
        this model. `jit_compile` is always False: XLA would compile the step
        into one cluster on one device.
        """
        if jit_compile is True:
            warnings.warn(
                f"{setting('jit_compile', True)} ignored: XLA would compile the whole step "
                f"into one cluster on one device, undoing {self.parallelism}.",
                UserWarning, stacklevel=2,
            )
        super().compile(*args, jit_compile=False, **kwargs)
        arguments = inspect.signature(keras.Model.compile).bind(
            self.template, *args, **kwargs).arguments
        arguments.pop("self")
        arguments.pop("optimizer", None)
        arguments.update(arguments.pop("kwargs", {}))
        arguments = template_compile_arguments(
            self.template, self.output_names, self.optimizer, (), arguments)
        self.template.compile(**arguments)

    def save(self, filepath, overwrite=True, **kwargs):
        """Saves `template` (architecture and the shared trained weights).

        `.h5` files load compiled with stock `keras.models.load_model`
        (see `multigpu.saving.save_model`).
        """
        return saving.save_model(self.template, filepath, overwrite=overwrite,
                                 **kwargs)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """Saves `template`'s weights, loadable by `template.load_weights`."""
        return self.template.save_weights(filepath, overwrite=overwrite, **kwargs)

    def load_weights(self, filepath, **kwargs):
        """Loads weights saved from the template (or from this model)."""
        return self.template.load_weights(filepath, **kwargs)


@keras.saving.register_keras_serializable(package="multigpu")
class ParallelModel(TemplateBacked, keras.Model):
    """A Keras model that runs one replica of `template` per device.

    Use it exactly like the template: `compile`, `fit`, `evaluate`,
    `predict`, or call it as a layer. Its weights are the template's.

    Saving: `save`, `save_weights` and `load_weights` (and so
    `keras.callbacks.ModelCheckpoint` and `BackupAndRestore` attached to this
    model) act on `template`, so the files are plain Keras models that load
    with `keras.models.load_model` on any machine, with or without multigpu.
    """

    parallelism = "data parallelism"
    engine = "replicate"
    engine_reason = "built as a ParallelModel"

    def __init__(self, template, devices, merge_device=HOST_DEVICE, **kwargs):
        graph = callable_graph(template)
        inputs = keras.tree.map_structure(_input_like, graph.input)
        replicas = DataParallel(template, devices, merge_device, name="replicas")
        outputs = _named_like(graph, replicas(inputs))
        kwargs.setdefault("name", f"{template.name}_parallel")
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

    @property
    def replicas_layer(self):
        return next(layer for layer in self.layers if isinstance(layer, DataParallel))

    @property
    def template(self):
        """The model whose weights every replica shares."""
        return self.replicas_layer.template

    @property
    def devices(self):
        """Canonical names of the devices that hold one replica each."""
        return list(self.replicas_layer.devices)

    @property
    def merge_device(self):
        """Device that slices batches and concatenates outputs."""
        return self.replicas_layer.merge_device

    def train_step(self, data):
        return self._split_once(super().train_step, data)

    def test_step(self, data):
        return self._split_once(super().test_step, data)

    def predict_step(self, data):
        return self._split_once(super().predict_step, data)

    def _split_once(self, step, data):
        """Runs a Keras step with one decision on how to split its batch.

        A batch with at least one row per device is split between all
        replicas, with no per-replica guard. A smaller batch (at most the
        last one of an epoch, or a batch size below the device count) runs
        on the first device as one sub-batch, exactly as the template would,
        guarded against zero rows. Both are traced into one `tf.cond`, which
        runs only the branch it takes; a guard on every replica instead cost
        up to 15% of each training step (`bench/`).
        """
        layer = self.replicas_layer
        devices = layer.devices
        rows = tf.shape(keras.tree.flatten(data)[0])[0]

        def run(step_devices, guard):
            # The step's custom gradients belong to this trace's graph.
            with layer.planned(step_devices, guard), (
                    gradients_lib.gradients_owned_by_ops()):
                return step(data)

        return tf.cond(
            rows >= len(devices),
            lambda: run(devices, guard=False),
            lambda: run(devices[:1], guard=True),
        )

    def batch_split(self, batch_size):
        """How a batch of `batch_size` rows is split: `[(device, rows)]`."""
        bounds = split_bounds(int(batch_size), len(self.devices))
        return [(d, bounds[i + 1] - bounds[i]) for i, d in enumerate(self.devices)]

    def get_config(self):
        return {
            "name": self.name,
            "template": keras.saving.serialize_keras_object(self.template),
            "devices": self.devices,
            "merge_device": self.merge_device,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        template = keras.saving.deserialize_keras_object(
            config.pop("template"), custom_objects=custom_objects
        )
        devices = devices_lib.resolve_devices(config.pop("devices"))
        return cls(template, devices, **config)


def _check_not_parallel(model):
    """Refuses a model this package already spread over devices."""
    if isinstance(model, (TemplateBacked, mirrored.MirroredModel)):
        raise ValueError(
            f"Invalid `model`: {literal(model.name)} is already a parallel "
            f"model (from {api('multi_gpu_model')} or "
            f"{api('model_parallel')}); its replicas cannot be replicated "
            "again. Pass the model it was built from, its `template`."
        )


def relocate_to_cpu(model):
    """Rebuilds `model` with its variables on the CPU, keeping its weights.

    The original `cpu_relocation` re-created the weights and so lost what the
    model had learned (keras-team/keras#11313); this copies them over.
    """
    try:
        with tf.device(HOST_DEVICE):
            clone = keras.models.clone_model(model)
    except ValueError as error:
        raise ValueError(
            f"Invalid `model` for {setting('cpu_relocation', True)}: {literal(model.name)} cannot "
            f"be cloned ({error}). Build the model under "
            f"tf.device('/cpu:0') instead and keep {setting('cpu_relocation', False)}."
        ) from None
    clone.set_weights(model.get_weights())
    return clone


def multi_gpu_model(model, gpus=None, cpu_merge=True, cpu_relocation=False,
                    engine=mirrored.DEFAULT_ENGINE):
    """Replicates a model on several devices (single-machine data parallelism).

    Every batch is divided into one sub-batch per device (sizes differ by at
    most one row; no row is lost), a replica of `model` runs on each device,
    forward and backward pass, and the outputs are concatenated into one
    batch. With a batch of 64 and `gpus=2`, each device processes 32 rows.
    The mathematics are those of the template: predictions are equal and one
    optimizer step equals one step of the template on the same batch (layers
    that use batch statistics, such as BatchNormalization, see sub-batches).

    Args:
        model: A built Keras model, the template: Sequential, functional,
            or subclassed (built: called once on a batch, or `build()`;
            its replicas take inputs of the shapes it was built with).
        gpus: `None` for every GPU (every logical CPU device on a machine
            without GPU; the single device on a one-device machine, with a
            warning), an int >= 2, a list of >= 2 GPU ids, or a list of >= 2
            device names such as `["/gpu:0", "/gpu:1"]`.
        cpu_merge: Slice batches and concatenate outputs on the CPU (True) or
            on the first device (False, for GPUs joined by NVLink).
        cpu_relocation: Rebuild the model's weights on the CPU, keeping their
            values. The returned model's `template` is then that CPU copy
            (save it, or the parallel model; not the original `model`).
        engine: `"auto"` (the default), `"replicate"` (slice each batch
            between replicas of the template, outputs concatenated) or
            `"mirrored"` (train a copy through
            `tf.distribute.MirroredStrategy`, mirrored variables and
            all-reduced gradients; same contract, see `multigpu.mirrored`).
            `"auto"` runs the replicate engine on logical CPU devices and on
            2 GPUs, the mirrored engine on 3 or more GPUs
            (`multigpu.scaling.choose_engine`, docs/benchmarks.md); it falls
            back to the replicate engine, with a warning naming why, when
            `cpu_merge=False` or the model cannot be copied.

    Returns:
        A `ParallelModel` or a `MirroredModel` (a `keras.Model`), with
        `.template`, `.devices`, `.engine` (the engine it runs) and
        `.engine_reason` (why). Its `save`/`save_weights` write the
        template, which loads back with plain `keras.models.load_model`.

    Raises:
        ValueError: for invalid `gpus`, flags, or an unbuilt model.
        TypeError: if `model` is not a `keras.Model`.

    Example:
    >>> parallel = multigpu.multi_gpu_model(model, gpus=4)
    >>> parallel.compile(optimizer="rmsprop", loss="categorical_crossentropy")
    >>> parallel.fit(x, y, epochs=20, batch_size=256)  # 64 rows per device
    >>> parallel.save("model.keras")                    # writes the template
    """
    _check_not_parallel(model)
    callable_graph(model)
    cpu_merge = check_flag("cpu_merge", cpu_merge)
    cpu_relocation = check_flag("cpu_relocation", cpu_relocation)
    mirrored.check_engine(engine, cpu_merge)
    devices = devices_lib.resolve_devices(gpus)
    template = relocate_to_cpu(model) if cpu_relocation else model
    if engine == "auto":
        choice = scaling.auto_engine(devices, cpu_merge)
    else:
        choice = scaling.EngineChoice(
            engine, f"requested with {setting('engine', engine)}")
    parallel = None
    if choice.engine == "mirrored":
        try:
            parallel = mirrored.MirroredModel(template, devices)
        except ValueError as error:
            if engine != "auto":
                raise
            choice = scaling.fall_back_to_replicate(
                choice, "the mirrored engine cannot take the model ("
                f"{' '.join(str(error).split())})")
    if choice.fallback:
        warnings.warn(scaling.fallback_message(choice), UserWarning,
                      stacklevel=2)
    if parallel is None:
        merge_device = HOST_DEVICE if cpu_merge else devices[0]
        parallel = ParallelModel(template, devices, merge_device)
    parallel.engine_reason = choice.reason + (
        f"; fell back: {choice.fallback}" if choice.fallback else "")
    return parallel
