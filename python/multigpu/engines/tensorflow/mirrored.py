"""The mirrored engine of `multi_gpu_model`: training through MirroredStrategy.

`multi_gpu_model(model, engine="mirrored")` returns a `MirroredModel`: a copy
of the template whose variables are created under `mirrored_strategy(...)`
(one mirrored copy per device; gradients all-reduced every step), with the
contract of the replicate engine:

* `.template` holds the trained weights: the template is the source of
  truth between calls. Every entry point (`fit`, `evaluate`, `predict`, the
  `*_on_batch` methods) goes through one synchronisation path,
  `MirroredModel._in_sync`: the replicas take the template's weights on
  entry, and the template takes the trained weights back when a call that
  trains returns or fails (and at every epoch end of `fit`).
* `save`/`save_weights` write the template (a plain Keras model);
  `load_weights`/`set_weights` set the template and the replicas.
* Predictions equal the template's, and one step on a batch equals one step
  of the template on that batch, also when the batch does not split evenly
  between replicas (the training step's `weigh_rows`,
  `multigpu.step.train_step.weighed_by_rows`).

The default engine, `"auto"` (`multigpu.engines.front.DEFAULT_ENGINE`), runs this
engine on 3 or more GPUs and the replicate engine elsewhere; `python -m bench.lockstep`
measures both on logical CPU devices.
"""

import contextlib

import keras

from multigpu import internals, tensorflow_internals
from multigpu.distribute import strategy as strategy_lib
from multigpu.engines.compiled import fresh_optimizer
from multigpu.engines.copies import copy_in_scope
from multigpu.engines.functional import callable_graph, layer_name, output_names
from multigpu.engines.template import (
    TemplateBacked,
    built_like,
    compile_defaults,
    template_compile_arguments,
)
from multigpu.engines.tensorflow.device_pass import resolve_jit_compile, run_pass
from multigpu.engines.tensorflow.forward import PassLayout, flat_forward
from multigpu.engines.tensorflow.sync_batchnorm import synchronize
from multigpu.engines.tensorflow.trainer import TensorFlowTrainer
from multigpu.inputs import bound_arguments
from multigpu.messages import literal, setting


class _CopyBackEachEpoch(keras.callbacks.Callback):
    """Copies the trained weights to the template at every epoch end."""

    def __init__(self, parallel):
        super().__init__()
        self._parallel = parallel

    def on_epoch_end(self, epoch, logs=None):
        self._parallel.copy_to_template()


def layer_running_r(model):
    """The first layer of `model` whose code is R's, or None.

    keras3 makes a layer or model class written in R (`Layer()`,
    `new_layer_class()`, `new_model_class()`) a Python class whose module
    is named `<r-...>`; a Lambda layer over an R function calls it through
    reticulate (`rpytools`). Reticulate runs R code on R's main thread
    only.

    Args:
        model: A Keras model.

    Returns:
        The layer (`model` itself included), or None.
    """
    for layer in [model, *internals.nested_layers(model)]:
        if any(str(getattr(cls, "__module__", "")).startswith("<r-")
               for cls in type(layer).__mro__):
            return layer
        function = getattr(layer, "function", None)
        if isinstance(layer, keras.layers.Lambda) and str(
                getattr(function, "__module__", "")).startswith("rpytools"):
            return layer
    return None


def check_no_r_code(model, invalid):
    """Refuses a model with R code: a strategy traces replicas in threads.

    `MirroredStrategy.run` traces each replica's step in a thread of its
    own while the main thread waits for them; an R function called there
    waits for R's main thread, which never comes (the process hangs).

    Args:
        model: The Keras model.
        invalid: What the message starts with: the argument that is
            invalid, and for what (``"Invalid `model` for ..."``).

    Raises:
        ValueError: naming the layer written in R (`layer_running_r`).
    """
    layer = layer_running_r(model)
    if layer is None:
        return
    raise ValueError(
        f"{invalid}: {literal(layer.name)} ({type(layer).__name__}) runs R "
        "code, and a MirroredStrategy traces each replica in a thread of "
        "its own, where R code cannot run (R runs on its main thread only; "
        f"the call would wait forever). Use {setting('engine', 'replicate')}"
        ", which traces every replica on the main thread.")


def _check_same_weights(template, replica):
    mismatched = [
        (t.path, tuple(t.shape), tuple(r.shape))
        for t, r in zip(template.weights, replica.weights)
        if tuple(t.shape) != tuple(r.shape)
    ]
    if mismatched or len(template.weights) != len(replica.weights):
        raise ValueError(
            f"Invalid `model` for {setting('engine', 'mirrored')}: {literal(template.name)} cannot "
            f"be copied weight for weight ({mismatched[:3]}). Use "
            f"{setting('engine', 'replicate')}, which needs no copy."
        )


def _metric_in_scope(metric):
    """A metric object made anew, in the current strategy's scope.

    A metric made outside the scope keeps plain variables, which every
    replica updates in turn: its values within an epoch are then not one
    device's. Names and functions are left as they are, and so is a metric
    whose config does not rebuild it (an unregistered class).
    """
    if not isinstance(metric, keras.metrics.Metric):
        return metric
    try:
        return keras.metrics.deserialize(keras.metrics.serialize(metric))
    except (TypeError, ValueError):
        return metric


def _check_one_step_per_execution(steps):
    """Refuses `steps_per_execution` above 1, which Keras 3 cannot run here.

    Keras's loop of several steps in one call runs the strategy's step
    inside a `tf.cond` of a `tf.while_loop`, whose `merge_call`s fail under
    `MirroredStrategy` ("You must feed a value for placeholder tensor",
    keras-team/keras#19246), with or without this engine.
    """
    if isinstance(steps, (int, float)) and steps > 1:
        raise ValueError(
            f"Invalid `steps_per_execution` for {setting('engine', 'mirrored')}: "
            f"received {literal(steps)}; Keras 3 cannot run several steps per "
            "call under MirroredStrategy (keras-team/keras#19246). Use "
            f"{setting('steps_per_execution', 1)} (the default) or "
            f"{setting('engine', 'replicate')}."
        )


def _outputs_renamed(graph, names):
    """`graph`'s own outputs, renamed `names` (the template's, made unique).

    A shared sub-model's output used twice names two outputs alike; the
    repeat goes through an `Identity` layer with a unique name (see
    `functional.unique_names`), so loss and metric dicts can address it. So
    does the output of a copied subclassed model, named after the copy.
    """
    flat = keras.tree.flatten(graph.output)
    renamed = [
        t if layer_name(t) == name
        else keras.layers.Identity(name=name, autocast=False)(t)
        for t, name in zip(flat, names)
    ]
    return keras.tree.pack_sequence_as(graph.output, renamed)


@keras.saving.register_keras_serializable(package="multigpu")
class MirroredModel(TensorFlowTrainer, TemplateBacked,
                    tensorflow_internals.BuildsFromOneReplica, keras.Model):
    """A copy of `template` trained with `tf.distribute.MirroredStrategy`.

    Made by `multi_gpu_model(model, engine="mirrored")`. Use it like the
    template; after `fit` the template holds the trained weights.

    Args:
        template: A built Keras model (Sequential or functional).
        devices: Canonical device names, one replica per device.
        sync_batchnorm: Pool BatchNormalization's statistics across the
            replicas in training (`sync_batchnorm.synchronize`), so they are
            those of the whole batch.

    Raises:
        ValueError: if `template` cannot be copied, or its copy
            (`copies.copy_in_scope`: every layer's state carried) gives
            other outputs than `template` on a probe batch
            (`copies.CopyMismatch`, naming the first layer that differs).
    """

    config_keys = ("devices", "sync_batchnorm")

    def __init__(self, template, devices, sync_batchnorm=False, **kwargs):
        devices = list(devices)
        invalid = f"Invalid `model` for {setting('engine', 'mirrored')}"
        check_no_r_code(template, invalid)
        strategy = strategy_lib.strategy_over(devices)
        replicate = setting("engine", "replicate")
        replica = copy_in_scope(
            template, strategy, invalid,
            fix=(f"Use {replicate}, which trains {literal(template.name)} "
                 "itself and needs no copy."),
            uncopyable_fix=f"Use {replicate}, which needs no copy.")
        _check_same_weights(template, replica)
        if sync_batchnorm:
            synchronize(replica)
        # The layers the model adds take the template's dtype policy too.
        with strategy.scope(), built_like(template):
            kwargs.setdefault("name", f"{template.name}_mirrored")
            graph = callable_graph(replica)
            names = output_names(callable_graph(template))
            super().__init__(inputs=graph.input,
                             outputs=_outputs_renamed(graph, names), **kwargs)
        # The template is not one of this model's layers: its weights are
        # a copy's.
        internals.set_untracked(self, "_template", template)
        self._device_names = tuple(devices)
        self._sync_batchnorm = bool(sync_batchnorm)
        # Open `_in_sync` blocks.
        self._sync_depth = 0

    @property
    def template(self):
        """The model that holds the trained weights between calls."""
        return self._template

    @property
    def devices(self):
        """Canonical names of the devices that hold one replica each."""
        return list(self._device_names)

    @property
    def sync_batchnorm(self):
        """Whether BatchNormalization pools its statistics over all rows."""
        return self._sync_batchnorm

    @property
    def strategy(self):
        """The `tf.distribute.MirroredStrategy` the replicas live in."""
        return self.distribute_strategy

    engine_reason = "built as a MirroredModel"
    parallelism = "data parallelism"

    @property
    def engine(self):
        """The engine of `multi_gpu_model` this model runs: `"mirrored"`."""
        return "mirrored"

    def copy_to_template(self, optimizer_state=False):
        """Copies the replicas' (trained) weights to the template.

        Args:
            optimizer_state: Also copy the optimizer's state into the
                template's optimizer (`compile` gave it one of its own).
        """
        self.template.set_weights(super().get_weights())
        if optimizer_state:
            self._copy_optimizer_state()

    def copy_from_template(self):
        """Copies the template's weights to every replica."""
        super().set_weights(self.template.get_weights())

    def compile(self, *args, jit_compile=False, **kwargs):
        """Compiles under the strategy's scope (so optimizer state mirrors).

        An optimizer instance made outside the scope is re-created inside it
        from its config (it must not have been used yet). Unlike the other
        engines' models, the template gets an optimizer of its own: this
        one's variables are mirrored. `jit_compile=True` compiles each
        replica's forward and backward pass with XLA on its device
        (`device_pass.resolve_jit_compile` says when it cannot, and what
        "auto" gives); Keras's step around them (the loss, the NaN/inf
        guard, the all-reduce and the update) is not compiled.
        `compile()` with no arguments takes the defaults of the template's
        own `compile` (a KerasHub task's), as `TemplateBacked.compile`
        does.
        """
        args, kwargs = compile_defaults(self, args, kwargs)
        optimizer = args[0] if args else kwargs.pop("optimizer", "rmsprop")
        args = args[1:]
        _check_one_step_per_execution(kwargs.get("steps_per_execution", 1))
        with self.strategy.scope():
            optimizer = self._optimizer_in_scope(optimizer)
            arguments = bound_arguments("compile", self,
                                        (optimizer, *args), kwargs)
            for key in ("metrics", "weighted_metrics"):
                arguments[key] = keras.tree.map_structure(
                    _metric_in_scope, arguments.get(key))
            arguments["jit_compile"] = False
            keras.Model.compile(self, **arguments)
        self.jit_compile = jit_compile
        # The template is compiled alike, with an optimizer of its own that
        # `save` fills with this one's state: saved files load compiled.
        self.template.compile(**template_compile_arguments(
            self.template, self.output_names,
            fresh_optimizer(self.optimizer), args, kwargs))

    compiles_replicas = True

    def resolve_jit_compile(self, value):
        """`jit_compile=value` here (`device_pass.resolve_jit_compile`)."""
        return resolve_jit_compile(self, value)

    def _compiled_over(self):
        """The variables of each replica's XLA-compiled pass; None without."""
        if not self._replica_jit:
            return None
        return (list(self.trainable_variables)
                + list(self.non_trainable_variables))

    def _copy_optimizer_state(self):
        """Copies the optimizer's (trained) state to the template's."""
        source = getattr(self, "optimizer", None)
        target = getattr(self.template, "optimizer", None)
        if source is None or target is None or not source.built:
            return
        if not target.built:
            target.build(self.template.trainable_variables)
        if len(target.variables) == len(source.variables):
            for t, v in zip(target.variables, source.variables):
                t.assign(keras.ops.convert_to_numpy(v))

    def _optimizer_in_scope(self, optimizer):
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            return optimizer
        # The step count is the optimizer's first variable (`iterations`
        # is a tensor with gradient accumulation).
        if self.strategy.extended.variable_created_in_scope(
                optimizer.variables[0].value):
            return optimizer
        if optimizer.built:
            raise ValueError(
                f"Invalid `optimizer`: received a {type(optimizer).__name__} "
                "that was already used (built) for other variables. Pass a "
                f"new optimizer instance, or its name, e.g. {setting('optimizer', 'adam')}."
            )
        return fresh_optimizer(optimizer)

    @contextlib.contextmanager
    def _in_sync(self, trains):
        """The one path by which every entry point keeps the copies in sync.

        Entering, the replicas take the template's weights; leaving a call
        that trains, however it ends (a NaN batch, an exception in a
        callback, an interrupt), the template takes the replicas'. A call
        made inside another (`fit`'s validation, a callback's `predict`)
        leaves both alone: the replicas hold the weights being trained.

        Args:
            trains: Whether the call changes the weights.
        """
        depth = self._sync_depth
        if depth == 0:
            self.copy_from_template()
        self._sync_depth = depth + 1
        try:
            yield
        finally:
            self._sync_depth = depth
            if depth == 0 and trains:
                self.copy_to_template()

    def fit_callbacks(self):
        """The template takes the trained weights at every epoch end."""
        return [_CopyBackEachEpoch(self)]

    def fit(self, *args, **kwargs):
        """`keras.Model.fit`; the template holds the weights of every epoch."""
        with self._in_sync(trains=True):
            return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        """`keras.Model.evaluate` of the template's weights.

        Inside `fit` (its validation) the replicas hold the weights being
        trained, newer than the template's until the epoch ends: they are
        evaluated as they are.
        """
        with self._in_sync(trains=False):
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        with self._in_sync(trains=False):
            return super().predict(*args, **kwargs)

    # `train_on_batch` splits its batch between the replicas (through `fit`),
    # which Keras's own does not under a strategy.
    splits_train_on_batch = True

    def train_on_batch(self, x, y=None, sample_weight=None,
                       class_weight=None, return_dict=False):
        """One step on one batch, split between the replicas.

        Keras's `train_on_batch` gives every replica the whole batch under
        a strategy. The gradients of an Embedding (IndexedSlices) then reach
        Adam's update as several copies, and one Adam step differed from
        the template's by 1e-2. The batch goes through `fit` as one batch
        instead, split as in any other step.
        """
        rows = int(keras.tree.flatten(x)[0].shape[0])
        with self._in_sync(trains=True):
            if rows == 0:
                return super().train_on_batch(
                    x, y, sample_weight=sample_weight,
                    class_weight=class_weight, return_dict=return_dict)
            history = super().fit(
                x, y, batch_size=rows, epochs=1, shuffle=False, verbose=0,
                sample_weight=sample_weight, class_weight=class_weight)
        logs = {k: float(v[-1]) for k, v in history.history.items()}
        if return_dict:
            return logs
        return internals.metrics_in_order(self, logs)

    def test_on_batch(self, *args, **kwargs):
        with self._in_sync(trains=False):
            return super().test_on_batch(*args, **kwargs)

    def predict_on_batch(self, x):
        """Predictions for one batch, split between the replicas.

        Keras's `predict_on_batch` gives every replica the whole batch under
        a strategy and concatenates their outputs (`replicas` times the
        rows); `predict` with the batch as its only batch splits it.
        """
        rows = int(keras.tree.flatten(x)[0].shape[0])
        with self._in_sync(trains=False):
            if rows == 0:
                return super().predict_on_batch(x)
            return super().predict(x, batch_size=rows, verbose=0)

    def set_weights(self, weights):
        """Sets the template's weights, and so the replicas'."""
        self.template.set_weights(weights)
        self.copy_from_template()

    def call(self, inputs, training=None, mask=None):
        """The replica's forward pass, safe on a share of zero rows.

        A batch with fewer rows than replicas leaves some replicas nothing,
        and kernels fail on zero rows (oneDNN: a convolution after
        MaxPooling reports "input depth must be evenly divisible by filter
        depth") or, in training, give BatchNormalization NaN statistics.
        Such a replica runs the pass on one row of zeros, with no `tf.cond`
        (`forward.padded_on_empty_share`): its outputs are cut back to zero
        rows, its layer-made loss weighs nothing and it writes no moving
        statistics. With `sync_batchnorm` in training, the pass has
        all-reduces that every replica must join (a `tf.cond` would refuse
        them); the pooled moments leave the row of zeros out, and every
        replica writes the same pooled statistics.

        The losses the layers add (`add_loss`, `activity_regularizer`)
        come out of the pass and are the model's own (`add_loss`), once
        per replica; the training step weighs them, with the rest of the
        loss, by the replica's rows (`train_step.weighed_by_rows`): a
        layer-made loss counts as the row-weighted mean of the replicas'
        losses, as `forward.rows_weighted_loss` combines them on the
        replicate engine.
        """
        def functional(args, training):
            return super(MirroredModel, self).call(args, training=training,
                                                   mask=mask)

        layout = PassLayout()
        pooled = self._sync_batchnorm and training is not None and (
            training is not False)
        forward = flat_forward(functional, inputs, training, layout,
                               hold_empty_writes=not pooled)
        flat, loss, new_values = layout.split(run_pass(
            forward, keras.tree.flatten(inputs), self._compiled_over()))
        layout.commit(new_values)
        if loss is not None:
            # `Layer.add_loss`: a functional model's own raises
            # NotImplementedError (Keras 3.15 keeps it for symbolic losses).
            keras.layers.Layer.add_loss(self, loss)
        return keras.tree.pack_sequence_as(self.output, flat)
