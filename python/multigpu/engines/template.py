"""Models and layers backed by a template: the template holds the weights.

`TemplateLayer` runs a template model inside another model; `TemplateBacked`
gives a wrapping model the compile and save behaviour of its template, so
files it writes are plain Keras models. Every engine builds on both;
`TemplateWrapper` is the functional model around one `TemplateLayer` that
the replicate engine and `model_parallel` return.
"""

import contextlib
import warnings

import keras

from multigpu import devices as devices_lib
from multigpu import internals, saving
from multigpu.distribute import inputs
from multigpu.distribute import strategy as strategy_lib
from multigpu.engines import compiled
from multigpu.engines.functional import callable_graph, layer_name, outputs_named_after
from multigpu.messages import setting
from multigpu.step import nonfinite
from multigpu.step import train_function as chain
from multigpu.step import train_step as training_step


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


def warn_if_jit_compile(jit_compile, parallelism):
    """Warns that `jit_compile` is ignored by a model that runs without XLA.

    For the models whose engine compiles no replica with XLA
    (`model_parallel`'s): XLA would compile the whole step into one cluster
    on one device, which cannot reach variables on the other devices
    (TensorFlow's "Trying to access resource ... located in device ..." in
    `fit`). The data-parallel engines compile each replica's pass instead
    (`TemplateBacked.resolve_jit_compile`).

    Args:
        jit_compile: The `jit_compile` argument of `compile`.
        parallelism: What XLA would undo, e.g. `"data parallelism"`.
    """
    if jit_compile is True:
        warnings.warn(
            f"{setting('jit_compile', True)} ignored: XLA would compile the whole step "
            f"into one cluster on one device, undoing {parallelism}.",
            UserWarning, stacklevel=3,
        )


def layer_without_jit(model):
    """The first layer of `model` (itself included) that XLA cannot compile.

    Keras's own test (`supports_jit`, which string preprocessing layers
    such as `TextVectorization` and `StringLookup` set to False), or None.
    """
    for layer in [model, *internals.nested_layers(model)]:
        if not getattr(layer, "supports_jit", True):
            return layer
    return None


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


class _FitInputs:
    """The input iterator the current `fit` last passed to its train function.

    `TemplateBacked.fit` frees it when `fit` raises (`release`), so that it
    is not freed later by a garbage collection, when freeing it can wait
    for its tf.data threads (docs/tf-data-stall.md). Held by the model; the train
    function's `"watch"` link (`watching`) refers to this object, not the
    model.
    """

    def __init__(self):
        self.calls = []  # one list per `fit` in progress, innermost last

    def seen(self, iterator):
        if self.calls:
            self.calls[-1][:] = [iterator]

    def watching(self, inner):
        """`inner` (a train function), telling this object its iterator."""

        def train(*args, **kwargs):
            if args:
                self.seen(args[0])
            return inner(*args, **kwargs)

        return train

    @contextlib.contextmanager
    def freed_on_failure(self, model):
        """A block (one `fit`) whose iterator is freed if it raises."""
        seen = []
        self.calls.append(seen)
        try:
            yield
        except BaseException:
            for iterator in seen:
                internals.release_iterator(iterator)
            internals.drop_cached_evaluation(model)
            raise
        finally:
            seen.clear()
            self.calls.remove(seen)


class TemplateBacked:
    """Compiling, saving and config for models whose weights are a template's.

    Mixed into a `keras.Model` (before it) by every engine's model:
    `ParallelModel`, `MirroredModel`, `PartitionedModel`. `compile` compiles
    the template alike, sharing the optimizer; `save`, `save_weights` and
    `load_weights` act on the template, so files are plain Keras models. A
    model that trains copies of the template's variables (the mirrored
    engine) overrides `copy_to_template` and `copy_from_template`, which
    saving and loading call.

    A subclass provides `template` and `devices`, takes
    `(template, devices, *config_keys[1:])` in its constructor and names its
    config in `config_keys`, each readable as an attribute.

    Training stops on a batch holding NaN or inf (`multigpu.step.nonfinite`) unless
    `check_finite` is set to False.
    """

    parallelism = "the device placement"
    config_keys = ("devices",)
    _check_finite = True

    @property
    def check_finite(self):
        """Whether `fit` stops on NaN or inf in a batch (default True).

        Each training step checks its inputs, labels and sample weights
        first and raises `multigpu.step.nonfinite.NonFiniteInputError`, naming the
        epoch, the batch and the input, instead of training the weights into
        NaN; the weights and the optimizer's state keep their values of the
        step before. Set it to False to train without the check.
        """
        return self._check_finite

    @check_finite.setter
    def check_finite(self, value):
        value = nonfinite.check_finite_flag(value)
        if value != self.check_finite:
            # The check is traced into the step function: trace it again.
            chain.discard(self)
        self._check_finite = value

    def train_step(self, data):
        """One training step (`multigpu.step.train_step.train_step`).

        Keras's step, with the batch checked for NaN and inf first when
        `check_finite` is on: a bad batch changes nothing, and the train
        function raises `NonFiniteInputError`. Engines that split the step
        (`ParallelModel`) call it on the whole batch inside theirs.
        """
        record = self._guard()[0] if self.check_finite else None
        # Under a strategy (the mirrored engine) the replicas' rows weigh
        # as one device's; elsewhere `weigh_rows` changes nothing.
        return training_step.train_step(
            self, data, record, [layer_name(t) for t in self.inputs],
            list(self.output_names), weigh_rows=True)

    def make_train_function(self, force=False):
        """Keras's train function, with this model's links.

        The `"watch"` link (`_FitInputs.watching`) and, when
        `check_finite` is on, the `"guard"` link (`nonfinite.Reporting`) of
        `multigpu.step.train_function`; a forced remake keeps the other
        links.
        """
        guard = self._guard()  # its variables exist before the step is traced
        self._build_optimizer()
        with chain.keeping_links(self), self._as_without_xla():
            super().make_train_function(force)
        if self.train_function is None:
            return None
        chain.link(self, "watch", self._fit_inputs().watching)
        if self.check_finite:
            chain.link(self, "guard", nonfinite.Reporting(*guard))
        else:
            chain.unlink(self, "guard")
        return self.train_function

    def _build_optimizer(self):
        """Builds the optimizer's variables now, before the step is traced.

        Without a strategy Keras builds an unbuilt optimizer while tracing
        the first step. The replicate engine's step holds a `tf.cond` (a
        batch with fewer rows than devices runs on one device), and slots
        made in one branch's trace fail in the other's ("Incompatible
        shapes: [5,6] vs. [0]" from Adam); an optimizer whose `build`
        computes (`ScheduleFreeAdamW` copies the weights) would also run
        that computation in every step. Under a strategy Keras builds it
        before the step, as here.
        """
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            with self.distribute_strategy.scope():
                optimizer.build(self.trainable_variables)

    def _guard(self):
        """This model's `(nonfinite.Record, nonfinite.Position)`, made once."""
        # Untracked: the record's variables are not the model's state.
        return internals.untracked(self, "_guard_parts", make=lambda: (
            nonfinite.Record(self.distribute_strategy), nonfinite.Position()))

    def _fit_inputs(self):
        """This model's `_FitInputs`, made once (kept out of Keras's tracking)."""
        return internals.untracked(self, "_fit_inputs_parts", make=_FitInputs)

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
    # evaluate: Keras's, with the data checked first (`multigpu.distribute.inputs`).

    def fit(self, *args, **kwargs):
        compile_like_template(self)
        position = self._guard()[1]
        args, kwargs = with_callbacks(self, args, kwargs,
                                      [position, *self.fit_callbacks()])
        # A failed `fit` frees its input iterator before it raises (see
        # `_FitInputs`): nothing waits on it later. The links its callbacks
        # registered on the train function go with it (`chain.fitting`).
        try:
            with (self._fit_inputs().freed_on_failure(self),
                  chain.fitting(self)):
                return inputs.checked_call(self, "fit", super().fit, args,
                                           kwargs)
        finally:
            # A failed `fit` ends without `on_train_end`.
            position.clear()

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

    def compile(self, *args, jit_compile=False, **kwargs):
        """Compiles like `keras.Model.compile`, and the template alike.

        The template is (re)compiled with the same loss and metrics and
        shares this model's optimizer, the one that trains the shared
        weights: saved files then carry the compile configuration and the
        optimizer state that training produced (even when the template had
        been compiled before), and `template.evaluate` works after training
        this model. `jit_compile` (True, False or "auto") is resolved by
        `resolve_jit_compile`: the replicate engine compiles each
        replica's forward and backward pass with XLA on the replica's
        device; an engine that cannot (`model_parallel`'s) warns and runs
        without XLA. Keras's step around the replicas (slicing, loss,
        update) is never compiled as one cluster.

        `compile()` with no arguments, when the template's class has a
        `compile` with defaults of its own (a KerasHub task), compiles with
        those defaults (`compile_defaults`). An uncompiled model whose
        template is compiled compiles as the template at its first `fit`,
        `evaluate` or `*_on_batch` step (`compile_like_template`).
        """
        strategy_lib.check_own_scope(self, "compile")
        if not self.compiles_replicas:
            warn_if_jit_compile(jit_compile, self.parallelism)
        args, kwargs = compile_defaults(self, args, kwargs)
        super().compile(*args, jit_compile=False, **kwargs)
        if self.compiles_replicas:
            self.jit_compile = jit_compile
        compile_template_alike(self, args, kwargs)

    # XLA (`jit_compile`). Keras's own `jit_compile` would compile the whole
    # step, every replica and the update, into one cluster on one device;
    # the engines that can (`compiles_replicas`) compile each replica's
    # pass on its device instead, and Keras's functions are made as without
    # XLA (`_making_functions`).

    compiles_replicas = False
    _replica_jit = False
    _making_functions = False

    @property
    def jit_compile(self):
        """Whether XLA compiles each replica's forward and backward pass.

        True: each replica's pass and its gradient are one XLA-compiled
        function on the replica's device (`forward.compiled_on`); the
        slicing, the loss, the NaN/inf guard and the update around them are
        not compiled. Set by `compile(jit_compile=...)` or directly, as
        Keras's: True, False or "auto" (`resolve_jit_compile`).
        """
        return False if self._making_functions else self._replica_jit

    @jit_compile.setter
    def jit_compile(self, value):
        resolved = self.resolve_jit_compile(value)
        if resolved != self._replica_jit:
            # The replicas' passes are traced into the step functions.
            chain.discard(self)
            self.test_function = None
            self.predict_function = None
        self._replica_jit = resolved
        self.replicas_compiled(resolved)

    def resolve_jit_compile(self, value):
        """What `jit_compile=value` runs here: whether XLA compiles replicas.

        Engines whose replicas XLA compiles override it; here (an engine
        that cannot) True is refused with `warn_if_jit_compile`'s warning.

        Returns:
            A bool.
        """
        if value is True and self.compiles_replicas:
            return True
        return False

    def replicas_compiled(self, compiled):
        """Tells the engine whether XLA compiles each replica's pass."""

    @contextlib.contextmanager
    def _as_without_xla(self):
        """A block in which Keras reads `jit_compile` as False.

        Keras's `make_*_function` would wrap its whole step in
        `tf.function(jit_compile=True)`.
        """
        previous, self._making_functions = self._making_functions, True
        try:
            yield
        finally:
            self._making_functions = previous

    def make_test_function(self, force=False):
        with self._as_without_xla():
            return super().make_test_function(force)

    def make_predict_function(self, force=False):
        with self._as_without_xla():
            return super().make_predict_function(force)

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
