"""Models and layers backed by a template: the template holds the weights.

`TemplateLayer` runs a template model inside another model; `TemplateBacked`
gives a wrapping model the compile and save behaviour of its template, so
files it writes are plain Keras models. Every engine builds on both, on
every backend; `TemplateWrapper` is the functional model around one
`TemplateLayer` that the replicate engine, `model_parallel` and the JAX
engine return. The TensorFlow engines' training step is theirs
(`multigpu.engines.tensorflow.trainer`): this module imports no TensorFlow.
"""

import contextlib
import warnings

import keras

from multigpu import devices as devices_lib
from multigpu import inputs, saving
from multigpu.engines import compiled
from multigpu.engines.functional import callable_graph, layer_name, outputs_named_after


def template_config(owner):
    """The config of a template-backed layer or model, Keras's aside.

    Args:
        owner: A `TemplateLayer` or `TemplateBacked` model.

    Returns:
        `{"template": <the template, serialized>, key: value, ...}` for the
        keys of `owner.config_keys`.
    """
    config = {"template": keras.saving.serialize_keras_object(owner.template)}
    config.update((key, getattr(owner, key)) for key in owner.config_keys)
    return config


def split_template_config(config, custom_objects=None):
    """The template, deserialized, and the rest of a `template_config`.

    Returns:
        `(template, rest)`: a Keras model and a new dict without `template`.
    """
    config = dict(config)
    template = keras.saving.deserialize_keras_object(
        config.pop("template"), custom_objects=custom_objects
    )
    return template, config


@contextlib.contextmanager
def built_like(template):
    """Builds the layers of this block under `template`'s dtype policy.

    Layers take the global dtype policy when they are created, and a policy
    set after the template was built (`keras.config.set_dtype_policy(
    "mixed_float16")`) would give an engine's layers, and the copies it
    makes of the template's, other dtypes than the template's. The global
    policy (kept per thread by Keras) is the template's in the block and is
    restored after it.

    Example:
    >>> with built_like(template):
    ...     copy = keras.models.clone_model(template)
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(template.dtype_policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def with_callbacks(model, args, kwargs, extra):
    """`fit`'s arguments, bound by name, with `extra` callbacks added.

    Args:
        model: The model whose `fit` is called.
        args: The positional arguments of the call.
        kwargs: Its keyword arguments.
        extra: Callbacks to run after the caller's.

    Returns:
        `(args, kwargs)` for `keras.Model.fit`; unchanged when they do not
        fit its signature (Keras then reports what is wrong).

    Example:
    >>> args, kwargs = with_callbacks(model, args, kwargs, [copy_back])
    >>> keras.Model.fit(model, *args, **kwargs)
    """
    try:
        arguments = inputs.bound_arguments("fit", model, args, kwargs)
    except TypeError:
        return args, kwargs
    callbacks = arguments.get("callbacks")
    if isinstance(callbacks, keras.callbacks.CallbackList):
        for callback in extra:
            callbacks.append(callback)
    else:
        arguments["callbacks"] = list(callbacks or []) + list(extra)
    return (), arguments


class TemplateLayer(keras.layers.Layer):
    """A layer that runs a (compiled) template model inside another model.

    Subclasses name the arguments of their constructor after `template`
    in `config_keys`, each readable as an attribute of the same name: that
    is their whole config.

    The layer casts nothing: its inputs reach the template as they come and
    its outputs have the template's dtypes (`autocast=False`).

    Args:
        template: The model the layer runs; its weights are the layer's.
    """

    config_keys = ()

    def __init__(self, template, **kwargs):
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        self.template = template

    @property
    def metrics(self):
        # The template's compiled metrics are the template's to report; the
        # outer model has its own, computed on the merged outputs.
        return []

    def compute_output_spec(self, inputs, training=None):
        return self.template.compute_output_spec(inputs)

    def get_config(self):
        return {**super().get_config(), **template_config(self)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        template, config = split_template_config(config, custom_objects)
        return cls(template, **config)


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
    arguments = inputs.bound_arguments("compile", template,
                                       (optimizer, *args), kwargs)
    own = [layer_name(t)
           for t in keras.tree.flatten(callable_graph(template).output)]
    if list(names) != own:
        for key in ("loss", "loss_weights", "metrics", "weighted_metrics"):
            if key in arguments:
                arguments[key] = _by_position(arguments[key], names)
    return arguments


def _has_own_compile(model):
    """Whether `model`'s class has a `compile` of its own (KerasHub tasks)."""
    return type(model).compile is not keras.Model.compile


def template_compile_config(template):
    """The `compile` arguments `template` was compiled with, made anew.

    Args:
        template: A Keras model.

    Returns:
        A dict of keyword arguments for `compile`
        (`compiled.compile_arguments`: a new optimizer with the template's
        hyperparameters, new loss and metric objects), without
        `jit_compile`; None when `template` is not compiled.

    Raises:
        ValueError: if the template's compile configuration cannot be
            rebuilt (an unregistered custom metric).

    Example:
    >>> parallel.compile(**template_compile_config(parallel.template))
    """
    arguments = compiled.compile_arguments(template, fix=(
        "Compile the parallel model with the metrics to use, or register "
        "custom metrics with keras.saving.register_keras_serializable()."))
    if arguments is not None:
        arguments.pop("jit_compile", None)
    return arguments


def compile_like_template(model):
    """Compiles `model` as its template was, if only the template is compiled.

    Called first by the entry points that need a compiled model (`fit`,
    `evaluate`, `train_on_batch`, `test_on_batch`): a template compiled
    before `multi_gpu_model` (a KerasHub task compiles itself when built)
    lends its loss, metrics and optimizer (a new one, with its
    hyperparameters) to the parallel model, which needs no `compile()` of
    its own. A compiled parallel model is left as it is.

    Args:
        model: A `TemplateBacked` model.

    Example:
    >>> compile_like_template(parallel)
    >>> parallel.fit(x, y)
    """
    if getattr(model, "compiled", False):
        return
    arguments = template_compile_config(model.template)
    if arguments is not None:
        model.compile(**arguments)


def compile_template_alike(model, args, kwargs):
    """Compiles `model.template` as `model` was, sharing its optimizer.

    Called by a `TemplateBacked` model's `compile` after its own.

    Args:
        model: A compiled `TemplateBacked` model.
        args: The positional arguments its `compile` took.
        kwargs: Its keyword arguments (without `jit_compile`).
    """
    arguments = inputs.bound_arguments("compile", model.template, args, kwargs)
    arguments.pop("optimizer", None)
    arguments = template_compile_arguments(
        model.template, model.output_names, model.optimizer, (), arguments)
    model.template.compile(**arguments)


def compile_defaults(model, args, kwargs):
    """`compile`'s arguments, or the template's defaults for a bare `compile()`.

    A `compile()` with no arguments on a model whose template's class has a
    `compile` of its own with defaults (a KerasHub task: the "auto"
    optimizer, loss and metrics) compiles the template so and returns its
    configuration; any other call's arguments are returned as they are.

    Args:
        model: A `TemplateBacked` model.
        args: The positional arguments of `compile`.
        kwargs: Its keyword arguments (without `jit_compile`).

    Returns:
        `(args, kwargs)` for `compile`.
    """
    if args or kwargs or not _has_own_compile(model.template):
        return args, kwargs
    model.template.compile()
    return (), template_compile_config(model.template) or {}


class TemplateBacked:
    """Compiling, saving and config for models whose weights are a template's.

    The base every engine's model shares, on every backend: mixed into a
    `keras.Model` (before it) by `ParallelModel`, `MirroredModel`,
    `PartitionedModel` and `ShardedModel`. `compile` compiles the template
    alike, sharing the optimizer; `save`, `save_weights` and `load_weights`
    act on the template, so files are plain Keras models; `fit`,
    `evaluate`, `predict` and the `*_on_batch` steps check their data
    first (`multigpu.inputs.checked_call`). A model that trains copies of
    the template's variables (the mirrored engine) overrides
    `copy_to_template` and `copy_from_template`, which saving and loading
    call. What a backend's training step adds (the TensorFlow engines' NaN
    guard, train-function links and XLA per replica) is in its engines'
    part (`multigpu.engines.tensorflow.trainer.TensorFlowTrainer`, mixed in
    before this class), as Keras keeps its backends' trainers apart from
    `keras.Model`. This module imports no TensorFlow.

    A subclass provides `template` and `devices`, takes
    `(template, devices, *config_keys[1:])` in its constructor and names its
    config in `config_keys`, each readable as an attribute.
    """

    parallelism = "the device placement"
    config_keys = ("devices",)

    def check_scope(self, method):
        """Refuses `self.<method>()` where this model's engine cannot run it.

        Called by `multigpu.inputs.checked_call` before the data checks.
        Nothing to refuse here; the TensorFlow engines refuse a strategy's
        scope that is not the model's.

        Args:
            method: The name of the `keras.Model` method called.
        """

    def copy_to_template(self, optimizer_state=False):
        """Copies what this model trained into the template.

        Nothing to copy here: the template's variables, and its optimizer,
        are this model's.

        Args:
            optimizer_state: Also copy the optimizer's state, so that a
                saved template resumes training where this model stopped.
        """

    def copy_from_template(self):
        """Copies the template's weights into this model (here: shared)."""

    # `fit`, `evaluate`, `predict` and the `*_on_batch` steps that train or
    # evaluate: Keras's, with the data checked first (`multigpu.inputs`).

    def fit(self, *args, **kwargs):
        compile_like_template(self)
        args, kwargs = with_callbacks(self, args, kwargs, self.fit_callbacks())
        return inputs.checked_call(self, "fit", super().fit, args, kwargs)

    def fit_callbacks(self):
        """Callbacks this model adds to every `fit` (after the caller's)."""
        return []

    def evaluate(self, *args, **kwargs):
        compile_like_template(self)
        return inputs.checked_call(self, "evaluate", super().evaluate, args,
                                   kwargs)

    def predict(self, *args, **kwargs):
        return inputs.checked_call(self, "predict", super().predict, args,
                                   kwargs)

    def train_on_batch(self, *args, **kwargs):
        compile_like_template(self)
        return inputs.checked_call(self, "train_on_batch",
                                   super().train_on_batch, args, kwargs)

    def test_on_batch(self, *args, **kwargs):
        compile_like_template(self)
        return inputs.checked_call(self, "test_on_batch",
                                   super().test_on_batch, args, kwargs)

    def compile(self, *args, **kwargs):
        """Compiles like `keras.Model.compile`, and the template alike.

        The template is (re)compiled with the same loss and metrics and
        shares this model's optimizer, the one that trains the shared
        weights: saved files then carry the compile configuration and the
        optimizer state that training produced (even when the template had
        been compiled before), and `template.evaluate` works after training
        this model. `jit_compile` is each engine's (see its `compile`).

        `compile()` with no arguments, when the template's class has a
        `compile` with defaults of its own (a KerasHub task), compiles with
        those defaults (`compile_defaults`). An uncompiled model whose
        template is compiled compiles as the template at its first `fit`,
        `evaluate` or `*_on_batch` step (`compile_like_template`).
        """
        jit_compile = kwargs.pop("jit_compile", "auto")
        args, kwargs = compile_defaults(self, args, kwargs)
        super().compile(*args, jit_compile=jit_compile, **kwargs)
        compile_template_alike(self, args, kwargs)

    def save(self, filepath, overwrite=True, **kwargs):
        """Saves `template` (architecture and the shared trained weights).

        `.h5` files load compiled with stock `keras.models.load_model`
        (see `multigpu.saving.save_model`).
        """
        self.copy_to_template(optimizer_state=True)
        return saving.save_model(self.template, filepath, overwrite=overwrite,
                                 **kwargs)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """Saves `template`'s weights, loadable by `template.load_weights`."""
        self.copy_to_template()
        return self.template.save_weights(filepath, overwrite=overwrite, **kwargs)

    def load_weights(self, filepath, **kwargs):
        """Loads weights saved from the template (or from this model).

        A file this model's `save_weights` wrote holds the template's
        weights. One written by Keras's own `keras.Model.save_weights(model,
        ...)` (keras3's `save_model_weights()` in R) holds this model's
        structure, the template inside it: such a file loads too.
        """
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.template.load_weights(filepath, **kwargs)
        except ValueError as error:
            try:
                keras.Model.load_weights(self, filepath, **kwargs)
            except ValueError:
                raise error from None
        else:
            # What the template's load warned, once it is the load that held.
            for warning in caught:
                warnings.warn_explicit(warning.message, warning.category,
                                       warning.filename, warning.lineno)
        self.copy_from_template()

    def get_config(self):
        return {"name": self.name, **template_config(self)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        template, config = split_template_config(config, custom_objects)
        devices = config.pop("devices")
        if len(devices) > 1:  # one device: a machine that has only one
            devices = devices_lib.resolve_devices(devices)
        return cls.from_template(template, devices, **config)

    @classmethod
    def from_template(cls, template, devices, **config):
        """The model over a deserialized `template`, as `from_config` builds it.

        Args:
            template: The template, as saved (weights where Keras put them).
            devices: Canonical device names.
            **config: The rest of `get_config()`.
        """
        return cls(template, devices, **config)


class TemplateWrapper(TemplateBacked, keras.Model):
    """A functional model around one `TemplateLayer` that runs its template.

    Its inputs are made from the template's (`input_like`), the layer runs
    the template on them, and its outputs take the template's output names
    (`functional.outputs_named_after`), so loss and metric dicts keyed by them work.
    Everything is made under the template's dtype policy (`built_like`).
    `template` and `devices` are the layer's. `ParallelModel` and
    `PartitionedModel` are such wrappers; a subclass names its default
    name's ending in `name_suffix` and, as any `TemplateBacked`, its config
    in `config_keys`.

    Args:
        template: The template model.
        graph_of: The template's functional graph, from the template
            (`functional.callable_graph` or `functional.symbolic_graph`).
        input_like: The wrapper's `keras.Input` for one of that graph's
            inputs.
        make_layer: Makes the `TemplateLayer` (called with no arguments,
            under the template's dtype policy).
        **kwargs: Keyword arguments of `keras.Model` (`name`).

    Example:
    >>> parallel = ParallelModel(template, ["/device:CPU:0", "/device:CPU:1"])
    >>> parallel.template_layer.template is parallel.template is template
    True
    """

    name_suffix = "wrapped"

    def __init__(self, template, graph_of, input_like, make_layer, **kwargs):
        with built_like(template):
            graph = graph_of(template)
            inputs = keras.tree.map_structure(input_like, graph.input)
            outputs = outputs_named_after(graph, make_layer()(inputs))
            kwargs.setdefault("name", f"{template.name}_{self.name_suffix}")
            super().__init__(inputs=inputs, outputs=outputs, **kwargs)

    @property
    def template_layer(self):
        """The `TemplateLayer` that runs the template."""
        return next(layer for layer in self.layers
                    if isinstance(layer, TemplateLayer))

    @property
    def template(self):
        """The model whose weights the wrapper trains."""
        return self.template_layer.template

    @property
    def devices(self):
        """Canonical names of the devices the template runs on."""
        return list(self.template_layer.devices)
