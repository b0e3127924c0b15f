"""The pipeline of a partitioned model: stages run in order, one per device.

`StagePlan` reads the template's graph once: which nodes each stage runs and
which tensors cross from stage to stage. `Stages` is the layer that runs the
plan, each stage on its device with its backward pass there, optionally over
micro-batches (GPipe).
"""

import keras
import tensorflow as tf

from multigpu import internals
from multigpu.devices import HOST_DEVICE
from multigpu.engines.functional import call_arguments, execution_order, symbolic_graph
from multigpu.engines.template import TemplateLayer
from multigpu.messages import literal, setting


def _forward():
    """The TensorFlow engines' forward path, which the stages run.

    Imported on first use: importing multigpu on another backend builds no
    TensorFlow engine (`model_parallel` runs on TensorFlow only).
    """
    from multigpu.engines.tensorflow import forward

    return forward


def _device_pass():
    """The TensorFlow engines' pass on a device, imported on first use (`_forward`)."""
    from multigpu.engines.tensorflow import device_pass

    return device_pass


class StagePlan:
    """Nodes of each stage and the tensors that cross stage boundaries.

    Attributes:
        graph: The template's functional graph.
        nodes: Per stage, the graph nodes it runs, in execution order.
        needs: Per stage, the ids of the tensors it reads from the model's
            inputs or from earlier stages.
        exports: Per stage, the ids of its tensors that later stages or the
            model's outputs read.

    Args:
        template: A built Sequential or functional Keras model.
        stages: One list of top-level layer names per stage.
        devices: One device name per stage (for messages).

    Raises:
        ValueError: if a stage reads the output of a later stage, or a Keras
            mask would cross a stage boundary.
    """

    def __init__(self, template, stages, devices):
        self.graph = symbolic_graph(template)
        stage_of_layer = {
            name: s for s, names in enumerate(stages) for name in names
        }
        producer = {}  # tensor id -> (stage, operation name)
        nodes = [[] for _ in stages]
        for node in execution_order(self.graph):
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
                if internals.keras_mask(tensor) is not None:
                    source = producer[tensor_id]
                    raise ValueError(
                        "Invalid `split`: the model cannot be cut there. The "
                        f"output of layer {literal(source[1])} (stage {source[0]}) "
                        f"carries a Keras mask (e.g. from {setting('mask_zero', True)} or "
                        f"Masking) into stage {stage} ({devices[stage]}); "
                        "masks do not cross stage boundaries. Start the "
                        "stage after the layers that consume the mask."
                    )


class Stages(TemplateLayer):
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

    config_keys = ("devices", "stages", "microbatches")

    def __init__(self, template, devices, stages, microbatches=1, **kwargs):
        super().__init__(template, **kwargs)
        self.devices = list(devices)
        self.stages = [list(names) for names in stages]
        self.microbatches = int(microbatches)
        self._plan = StagePlan(template, self.stages, self.devices)

    def _plain_forward(self, stage, training, logits_at):
        """Runs the nodes of one stage: stage inputs -> stage exports.

        The exports are followed by the logits Keras attached to those that
        are softmax or sigmoid outputs of the model; `logits_at` receives
        their indices when the function is traced (see
        `forward.flat_forward`: the stage's custom gradient, and the
        concatenation of micro-batches, would lose them).
        """
        plan = self._plan
        outputs_of_model = {id(x) for x in plan.graph.outputs}

        def forward(*inputs):
            values = dict(zip(plan.needs[stage], inputs))
            for node in plan.nodes[stage]:
                args, kwargs = call_arguments(node, values, training)
                outputs = node.operation(*args, **kwargs)
                values.update(
                    zip((id(x) for x in node.outputs), keras.tree.flatten(outputs))
                )
            exports = [values[i] for i in plan.exports[stage]]
            logits = [
                internals.logits_of(y) if i in outputs_of_model else None
                for i, y in zip(plan.exports[stage], exports)
            ]
            logits_at[:] = [i for i, z in enumerate(logits) if z is not None]
            return exports + [logits[i] for i in logits_at]

        return forward

    def _stage_forward(self, stage, training, logits_at):
        forward = self._plain_forward(stage, training, logits_at)
        if self.microbatches == 1:
            return forward
        return _forward().inference_on_empty_share(
            forward, self._plain_forward(stage, False, logits_at))

    def _run(self, flat_inputs, training):
        plan = self._plan
        values = {id(x): v for x, v in zip(plan.graph.inputs, flat_inputs)}
        for stage, device in enumerate(self.devices):
            inputs = [values[i] for i in plan.needs[stage]]
            logits_at = []
            forward = self._stage_forward(stage, training, logits_at)
            # The outer scope also places the IdentityN that wraps the
            # custom gradient, so activations go straight on.
            with tf.name_scope(f"stage{stage}"), tf.device(device):
                outputs = _device_pass().on_device(device, forward, inputs)
            values.update(zip(plan.exports[stage],
                              _forward().with_logits(outputs, logits_at)))
        return [values[id(x)] for x in plan.graph.outputs]

    def _run_on_at_least_one_row(self, flat_inputs, training):
        """The stages on the whole batch, one row of zeros added to a batch
        with none.

        Keras's TensorFlow ops fail on a batch of 0 rows: traced with a
        static 0, `Add` takes the operand for a bias and BatchNormalization
        matches its moments against it; at run time oneDNN's kernels
        (TensorFlow's default on CPUs with AVX512_VNNI, AVX512_BF16 or AMX)
        report "Incompatible shapes: [3] vs. [0,6,6,2]" inside
        BatchNormalization after a convolution. A batch whose rows are
        not known to be there runs on its rows and a row of zeros when it
        has none (a concatenation of no rows otherwise, and no `tf.cond`,
        which would keep the layers' losses inside a branch); the outputs
        are cut back to the batch's rows. Keras's `fit` never makes a
        training batch of 0 rows; the micro-batched pipeline runs an empty
        micro-batch in inference mode instead
        (`forward.inference_on_empty_share`).
        """
        if flat_inputs[0].shape[0]:
            return self._run(flat_inputs, training)
        with tf.device(HOST_DEVICE):
            rows, padded = _forward().padded_to_one_row(flat_inputs)
        outputs = self._run(padded, training)
        with tf.device(self.devices[-1]):
            return [_forward().leading_rows_with_logits(y, rows)
                    for y in outputs]

    def call(self, inputs, training=None):
        flat = keras.tree.flatten(inputs)
        if self.microbatches == 1:
            merged = self._run_on_at_least_one_row(flat, training)
        else:
            with tf.device(HOST_DEVICE):
                bounds = _forward().split_bounds(
                    tf.shape(flat[0])[0], self.microbatches
                )
            outputs = []
            for m in range(self.microbatches):
                with tf.device(HOST_DEVICE):
                    part = [x[bounds[m]:bounds[m + 1]] for x in flat]
                with tf.name_scope(f"microbatch{m}"):
                    outputs.append(self._run(part, training))
            with tf.device(self.devices[-1]):
                merged = [_forward().concat_with_logits(parts) for parts in zip(*outputs)]
        return keras.tree.pack_sequence_as(self._plan.graph.output, merged)
