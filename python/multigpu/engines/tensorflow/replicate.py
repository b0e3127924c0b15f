"""The replicate engine of `multi_gpu_model`: replica-slicing data parallelism.

Each batch is cut into one contiguous sub-batch per device, the template
model runs once per device on its sub-batch, and the outputs are concatenated
along the batch axis. The replicas are calls of the template itself, so they
share its weights: training the parallel model trains the template.
"""

import contextlib

import keras
import tensorflow as tf

from multigpu.arguments import check_int
from multigpu.devices import HOST_DEVICE
from multigpu.engines.functional import batch_input_like, callable_graph
from multigpu.engines.template import TemplateLayer, TemplateWrapper
from multigpu.engines.tensorflow.device_pass import on_device, resolve_jit_compile
from multigpu.engines.tensorflow.forward import (
    PassLayout,
    concat_with_logits,
    flat_forward,
    rows_weighted_loss,
    split_bounds,
)
from multigpu.engines.tensorflow.sync_batchnorm import GlobalBatchWalk
from multigpu.engines.tensorflow.trainer import TensorFlowTrainer
from multigpu.step import gradients as gradients_lib


class DataParallelReplicas(TemplateLayer):
    """Runs `template` once per device on a slice of the batch.

    Not usually built directly: `multi_gpu_model` wraps it in a model whose
    inputs and output names mirror the template's.

    Args:
        template: A built Keras model whose weights the replicas share.
        devices: Canonical device names, one replica per device.
        merge_device: Device on which the batch is sliced and the replica
            outputs concatenated.
        sync_batchnorm: In training, run the template node by node across
            the replicas so BatchNormalization takes its statistics over
            the whole batch (`sync_batchnorm.GlobalBatchWalk`).
    """

    config_keys = ("devices", "merge_device", "sync_batchnorm")

    def __init__(self, template, devices, merge_device=HOST_DEVICE,
                 sync_batchnorm=False, **kwargs):
        super().__init__(template, **kwargs)
        self.devices = list(devices)
        self.merge_device = merge_device
        self.sync_batchnorm = bool(sync_batchnorm)
        self._walk = (GlobalBatchWalk(template, merge_device)
                      if self.sync_batchnorm else None)
        self._output_struct = callable_graph(template).output
        # (devices, guard) used by the next traced call; see `planned`.
        self._plan = None
        # Whether XLA compiles each replica's pass (`ParallelModel`'s
        # `jit_compile`); not part of the config, as Keras's is not.
        self.xla = False

    @contextlib.contextmanager
    def planned(self, devices, guard):
        """Traces calls in this block with `devices` and, if `guard`, guarded.

        A caller that knows a batch has at least one row per device
        (`ParallelModel`'s steps decide once per step) can drop the
        per-replica zero-row guard (a padding op per input and a selection
        per written variable, `padded_when_empty`); it can also send a
        batch to one device.

        Args:
            devices: The devices of the replicas, a non-empty sublist of
                `self.devices`.
            guard: Whether each replica survives a sub-batch of zero rows
                (see `forward.padded_when_empty`).
        """
        previous, self._plan = self._plan, (list(devices), guard)
        try:
            yield
        finally:
            self._plan = previous

    def call(self, inputs, training=None):
        devices, guard = self._plan or (self.devices, True)
        if self._walk is not None and training and len(devices) > 1:
            merged, loss = self._walked(inputs, devices, guard, training)
        else:
            merged, loss = self._forward(inputs, devices, guard, training)
        if loss is not None:
            # The layer-made losses of the whole batch (see
            # `rows_weighted_loss`), which the layers no longer hold.
            self.add_loss(loss)
        return keras.tree.pack_sequence_as(self._output_struct, merged)

    def _forward(self, inputs, devices, guard, training):
        """One call of the template per device, outputs concatenated.

        Returns:
            `(flat outputs, loss)`: `loss` is the layer-made loss of the
            batch (`rows_weighted_loss`), or None when the template adds
            none.
        """
        flat_inputs = keras.tree.flatten(inputs)
        layout = PassLayout()
        forward = flat_forward(self.template, inputs, training, layout,
                               pad=guard)
        if len(devices) == 1:
            # One device: nothing to slice or concatenate.
            merged, loss, new_values = layout.split(on_device(
                devices[0], forward, flat_inputs, self._compiled_over()))
            layout.commit(new_values)
            return merged, loss
        return self._replicated(forward, layout, devices, flat_inputs)

    def _compiled_over(self):
        """The variables of each replica's compiled pass; None without XLA.

        With `xla` on, each replica's forward pass and its gradient are
        one XLA-compiled function on the replica's device
        (`device_pass.compiled_on`), which takes these variables' values.
        """
        if not self.xla:
            return None
        return (list(self.template.trainable_variables)
                + list(self.template.non_trainable_variables))

    def _walked(self, inputs, devices, guard, training):
        """The template walked across replicas, BatchNormalization pooled.

        A batch with fewer rows than devices, possible only when no step
        planned the call (`guard`: the layer called on its own), runs on
        the first device alone as the template would, so the walk gives
        every replica at least one row. The `tf.cond` of that choice drops
        the logits Keras attaches to softmax outputs; the steps of
        `ParallelModel` plan every call and keep them.
        """
        flat_inputs = keras.tree.flatten(inputs)
        if (flat_inputs[0].shape[0] or len(devices)) < len(devices):
            # A batch known to be smaller than the devices, traced only for
            # the branch `_split_once` never takes with it: shares of zero
            # rows, traced statically, would trip Keras 3.15's `ops.add`,
            # which takes a (0, n) tensor for a bias (an invalid BiasAdd).
            return self._forward(inputs, devices[:1], True, training)

        def walk():
            with tf.device(self.merge_device):
                bounds = split_bounds(tf.shape(flat_inputs[0])[0],
                                      len(devices))
                shares = [[x[bounds[i]:bounds[i + 1]] for x in flat_inputs]
                          for i in range(len(devices))]
            return self._walk(devices, shares, training)

        if not guard:
            return walk()
        rows = tf.shape(flat_inputs[0])[0]
        has_loss = []

        def flat(run):
            # `tf.cond` takes no None: the loss, when there is one, ends
            # the outputs.
            def branch():
                merged, loss = run()
                has_loss[:] = [loss is not None]
                return merged + ([loss] if loss is not None else [])
            return branch

        outputs = list(tf.cond(
            rows >= len(devices), flat(walk), flat(
                lambda: self._forward(inputs, devices[:1], True, training))))
        return (outputs[:-1], outputs[-1]) if has_loss[0] else (outputs, None)

    def _replicated(self, forward, layout, devices, flat_inputs):
        """Slices the batch, runs `forward` once per device, concatenates.

        Each replica's writes are committed before the next replica runs,
        as the template called once per replica writes them.

        Returns:
            `(flat outputs, loss)`, as `_forward`.
        """
        with tf.device(self.merge_device):
            bounds = split_bounds(tf.shape(flat_inputs[0])[0], len(devices))
            slices = [
                [x[bounds[i]:bounds[i + 1]] for x in flat_inputs]
                for i in range(len(devices))
            ]
        outputs, losses = [], []
        for device, flat in zip(devices, slices):
            merged, loss, new_values = layout.split(
                on_device(device, forward, flat, self._compiled_over()))
            layout.commit(new_values)
            outputs.append(merged)
            losses.append(loss)
        with tf.device(self.merge_device):
            merged = [concat_with_logits(parts) for parts in zip(*outputs)]
            return merged, rows_weighted_loss(losses, bounds)


@keras.saving.register_keras_serializable(package="multigpu")
class ParallelModel(TensorFlowTrainer, TemplateWrapper):
    """A Keras model that runs one replica of `template` per device.

    Use it exactly like the template: `compile`, `fit`, `evaluate`,
    `predict`, or call it as a layer. Its weights are the template's; its
    `template` and `devices` are those of its `DataParallelReplicas` layer.

    Saving: `save`, `save_weights` and `load_weights` (and so
    `keras.callbacks.ModelCheckpoint` and `BackupAndRestore` attached to this
    model) act on `template`, so the files are plain Keras models that load
    with `keras.models.load_model` on any machine, with or without multigpu.
    """

    parallelism = "data parallelism"
    engine = "replicate"
    engine_reason = "built as a ParallelModel"
    config_keys = ("devices", "merge_device", "sync_batchnorm")
    name_suffix = "parallel"

    def __init__(self, template, devices, merge_device=HOST_DEVICE,
                 sync_batchnorm=False, **kwargs):
        super().__init__(
            template, callable_graph, batch_input_like,
            lambda: DataParallelReplicas(template, devices, merge_device,
                                         sync_batchnorm, name="replicas"),
            **kwargs)

    @property
    def replicas_layer(self):
        """The `DataParallelReplicas` layer that runs the replicas."""
        return self.template_layer

    @property
    def merge_device(self):
        """Device that slices batches and concatenates outputs."""
        return self.template_layer.merge_device

    @property
    def sync_batchnorm(self):
        """Whether BatchNormalization pools its statistics over all rows."""
        return self.template_layer.sync_batchnorm

    # XLA: each replica's pass compiled on its device (`jit_compile`).
    compiles_replicas = True

    def resolve_jit_compile(self, value):
        """`jit_compile=value` here (`device_pass.resolve_jit_compile`)."""
        return resolve_jit_compile(self, value)

    def replicas_compiled(self, compiled):
        """Tells the replicas layer whether XLA compiles each replica."""
        self.template_layer.xla = bool(compiled)

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
        runs only the branch it takes, so a full batch pays for no guard.
        The cond holds the whole step (forward pass, loss, update), so
        what the forward pass creates never has to leave it.
        """
        layer = self.template_layer
        devices = layer.devices
        rows = tf.shape(keras.tree.flatten(data)[0])[0]

        def run(step_devices, guard):
            # The step's custom gradients belong to this trace's graph.
            with layer.planned(step_devices, guard), (
                    gradients_lib.gradients_owned_by_ops()):
                return step(data)

        known = keras.tree.flatten(data)[0].shape[0]
        if known is not None:
            # Every batch of this trace has `known` rows: trace only the
            # branch it takes (the other, on shares of zero rows, could
            # never run).
            return (run(devices, guard=False) if known >= len(devices)
                    else run(devices[:1], guard=True))
        return tf.cond(
            rows >= len(devices),
            lambda: run(devices, guard=False),
            lambda: run(devices[:1], guard=True),
        )

    def batch_split(self, batch_size):
        """How a batch of `batch_size` rows is split: `[(device, rows)]`.

        Raises:
            ValueError: if `batch_size` is not a whole number >= 0.
        """
        if isinstance(batch_size, float) and batch_size.is_integer():
            batch_size = int(batch_size)  # R's numbers arrive as floats
        batch_size = check_int("batch_size", batch_size, 0)
        bounds = split_bounds(batch_size, len(self.devices))
        return [(d, bounds[i + 1] - bounds[i]) for i, d in enumerate(self.devices)]
