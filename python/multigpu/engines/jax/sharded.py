"""`ShardedModel`: the model `multi_gpu_model` returns on the JAX backend.

The template's variables are replicated on every device (`mesh`), each
whole batch is handed to Keras's compiled step, and inside it the batch is
constrained to be split along the devices: XLA's partitioner gives each
device its share of the rows, runs the forward and backward pass there and
all-reduces what the step sums over rows (the loss, the metrics, the
gradients, BatchNormalization's moments). Batches that do not divide
evenly, and batches of fewer rows than devices, split unevenly, each
reduction over the real rows only: the step computes what the template's
step computes on one device.

Keras's `keras.distribution.DataParallel` splits batches too, but only
batches that divide evenly between the devices.
"""

import keras

from multigpu import internals
from multigpu.engines.functional import batch_input_like, callable_graph
from multigpu.engines.jax import guard
from multigpu.engines.jax import mesh as mesh_lib
from multigpu.engines.template import (
    TemplateLayer,
    TemplateWrapper,
    compile_defaults,
    compile_template_alike,
)
from multigpu.messages import literal, setting
from multigpu.step import train_function as train_function_lib


@keras.saving.register_keras_serializable(package="multigpu")
class ShardedTemplate(TemplateLayer):
    """Runs the template on a batch constrained to be split across devices.

    Args:
        template: The template model.
        devices: Canonical names of the devices (`multigpu.resolve_devices`).
    """

    config_keys = ("devices",)

    def __init__(self, template, devices, **kwargs):
        super().__init__(template, **kwargs)
        self.devices = list(devices)

    @property
    def mesh(self):
        """The 1-D `jax.sharding.Mesh` over `devices` (`mesh.device_mesh`)."""
        return internals.untracked(
            self, "_mesh", make=lambda: mesh_lib.device_mesh(self.devices))

    def call(self, inputs, training=None):
        return self.template(mesh_lib.split_batch(inputs, self.mesh),
                             training=training)


@keras.saving.register_keras_serializable(package="multigpu")
class ShardedModel(guard.HostGuarded, TemplateWrapper):
    """A Keras model whose compiled steps XLA splits across `devices`.

    Use it exactly like the template: `compile`, `fit`, `evaluate`,
    `predict`. Its weights are the template's, replicated on every device,
    so after `fit` the template holds the trained weights; `save`,
    `save_weights` and `load_weights` act on the template, so files are
    plain Keras models.

    BatchNormalization takes its statistics over the whole batch, as
    `sync_batchnorm=True` does on the TensorFlow engines: XLA's split
    reduces the moments over every device's rows.

    Args:
        template: The template model, built.
        devices: Canonical names of >= 1 devices.

    Example:
    >>> parallel = ShardedModel(model, ["/device:CPU:0", "/device:CPU:1"])
    >>> parallel.compile(optimizer="adam", loss="mse")
    >>> parallel.fit(x, y, batch_size=42)   # 21 rows per device
    """

    parallelism = "data parallelism"
    engine = "jax"
    engine_reason = "built as a ShardedModel"
    name_suffix = "parallel"

    def __init__(self, template, devices, **kwargs):
        super().__init__(
            template, callable_graph, batch_input_like,
            lambda: ShardedTemplate(template, devices, name="sharded"),
            **kwargs)
        mesh_lib.replicate_variables(template.variables, self.mesh)

    @property
    def mesh(self):
        """The 1-D `jax.sharding.Mesh` the batches are split over."""
        return self.template_layer.mesh

    def copy_from_template(self):
        """Replicates the template's weights (loaded, say) on every device again."""
        mesh_lib.replicate_variables(self.template.variables, self.mesh)

    @property
    def sync_batchnorm(self):
        """Always True: BatchNormalization sees the whole batch's statistics."""
        return True

    # Keras's own attribute, which its JAX trainer reads to `jax.jit` the
    # whole step (the batch is split inside it), in place of the
    # TensorFlow engines' per-replica switch (`TensorFlowTrainer.jit_compile`),
    # which would read False and run the step op by op.
    jit_compile = True

    def compile(self, *args, jit_compile=True, run_eagerly=False, **kwargs):
        """Compiles like `keras.Model.compile`, and the template alike.

        The template is compiled with the same loss and metrics and shares
        this model's optimizer (`TemplateBacked.compile`). The steps are
        always compiled by XLA, which splits the batches.

        Raises:
            ValueError: for `jit_compile=False` or `run_eagerly=True`: a
                step that XLA does not compile runs on one device.
        """
        for name, value, needed in (("jit_compile", jit_compile, True),
                                    ("run_eagerly", run_eagerly, False)):
            if value not in (needed, "auto"):
                raise ValueError(
                    f"Invalid `{name}`: received {literal(value)}. The JAX "
                    "engine splits each batch inside the step XLA compiles; "
                    "a step it does not compile would run on one device. "
                    f"Leave {setting(name, needed)}."
                )
        args, kwargs = compile_defaults(self, args, kwargs)
        keras.Model.compile(self, *args, jit_compile=True, **kwargs)
        compile_template_alike(self, args, kwargs)

    def fit(self, *args, **kwargs):
        return self.guarded_fit(args, kwargs)

    # Keras's steps on the whole batch: the template layer splits it, and
    # everything a step returns is made whole on every device again.

    def train_step(self, state, data):
        return mesh_lib.gather(keras.Model.train_step(self, state, data), self.mesh)

    def test_step(self, state, data):
        return mesh_lib.gather(keras.Model.test_step(self, state, data), self.mesh)

    def predict_step(self, state, data):
        return mesh_lib.gather(keras.Model.predict_step(self, state, data),
                               self.mesh)

    # Keras's step functions, each batch placed on the devices first (split
    # where it divides) and the state whole on every device.

    def make_train_function(self, force=False):
        # Below the links of the chain, which alone assigns it; a forced
        # remake keeps them.
        with train_function_lib.keeping_links(self):
            made = _newly_made(self, "train_function",
                               keras.Model.make_train_function, force)
            if made is not None:
                train_function_lib.rebase(
                    self, _fed(made, self.mesh, self._checked))
        return self.train_function

    def make_test_function(self, force=False):
        made = _newly_made(self, "test_function",
                           keras.Model.make_test_function, force)
        if made is not None:
            self.test_function = _fed(made, self.mesh)
        return self.test_function

    def make_predict_function(self, force=False):
        made = _newly_made(self, "predict_function",
                           keras.Model.make_predict_function, force)
        if made is not None:
            self.predict_function = _fed(made, self.mesh)
        return self.predict_function


def _newly_made(model, attribute, make, force):
    """The step function Keras's `make` made for `attribute`, or None.

    None when `make` kept the function the model had (already made, and not
    `force`d), which is then fed already.
    """
    before = getattr(model, attribute)
    make(model, force)
    function = getattr(model, attribute)
    return None if function is None or function is before else function


def _fed(function, mesh, checked=None):
    """`function(state, iterator)` on a replicated state and placed batches.

    The state's arrays are whole on every device (`mesh.keep_replicated`),
    so one compiled step serves every epoch, the first step after metrics
    were reset included; each batch is placed by `mesh.put_batch`, after
    `checked` (a function of the state and the iterator, the NaN/inf
    guard) when given.
    """

    def fed(state, iterator):
        if checked is not None:
            iterator = checked(state, iterator)
        return function(mesh_lib.keep_replicated(state, mesh),
                        (mesh_lib.put_batch(batch, mesh) for batch in iterator))

    return fed
