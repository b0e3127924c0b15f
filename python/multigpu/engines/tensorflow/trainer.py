"""`TensorFlowTrainer`: the TensorFlow engines' training step and its links.

Mixed into the TensorFlow engines' models before `TemplateBacked`
(`ParallelModel`, `MirroredModel`, `PartitionedModel`), as Keras keeps
`backend/tensorflow/trainer.py` apart from `keras.Model`: the guarded
training step of `multigpu.step` (the NaN/inf check inside the step), the
links of the train function (the guard's report, the input iterator
watched and freed when `fit` fails), a strategy's scope refused when it is
not the model's, and XLA per replica (`jit_compile`). The JAX engine has
its own (`multigpu.engines.jax.sharded`).
"""

import contextlib
import warnings

from multigpu import internals
from multigpu.distribute import strategy as strategy_lib
from multigpu.engines.functional import layer_name
from multigpu.engines.template import with_callbacks
from multigpu.messages import setting
from multigpu.step import guard as guard_lib
from multigpu.step import nonfinite
from multigpu.step import train_function as chain
from multigpu.step import train_step as training_step


def warn_if_jit_compile(jit_compile, parallelism):
    """Warns that `jit_compile` is ignored by a model that runs without XLA.

    For the models whose engine compiles no replica with XLA
    (`model_parallel`'s): XLA would compile the whole step into one cluster
    on one device, which cannot reach variables on the other devices
    (TensorFlow's "Trying to access resource ... located in device ..." in
    `fit`). The data-parallel engines compile each replica's pass instead
    (`TensorFlowTrainer.resolve_jit_compile`).

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


class _FitInputs:
    """The input iterator the current `fit` last passed to its train function.

    `TensorFlowTrainer.fit` frees it when `fit` raises (`release`), so that it
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


class TensorFlowTrainer:
    """The TensorFlow engines' training: the guarded step, its links, XLA.

    Mixed in before `multigpu.engines.template.TemplateBacked` (whose
    `fit`, `compile` and checked calls it extends) by the TensorFlow
    engines' models. Training stops on a batch holding NaN or inf
    (`multigpu.step.guard`) unless `check_finite` is set to False.

    Example:
    >>> class ParallelModel(TensorFlowTrainer, TemplateWrapper): ...
    """

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
        `check_finite` is on, the `"guard"` link (`guard.Reporting`) of
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
            chain.link(self, "guard", guard_lib.Reporting(*guard))
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
        """This model's `(guard.Record, nonfinite.Position)`, made once."""
        # Untracked: the record's variables are not the model's state.
        return internals.untracked(self, "_guard_parts", make=lambda: (
            guard_lib.Record(self.distribute_strategy), nonfinite.Position()))

    def _fit_inputs(self):
        """This model's `_FitInputs`, made once (kept out of Keras's tracking)."""
        return internals.untracked(self, "_fit_inputs_parts", make=_FitInputs)

    def check_scope(self, method):
        """Refuses `self.<method>()` inside the scope of a strategy not its own.

        Raises:
            StrategyUsageError: if another strategy's scope is open
                (`strategy.check_own_scope`).
        """
        strategy_lib.check_own_scope(self, method)

    def fit(self, *args, **kwargs):
        """`TemplateBacked.fit`, with the guard's position and the links of one fit.

        The guard's `nonfinite.Position` callback comes first of this
        model's callbacks.
        """
        position = self._guard()[1]
        args, kwargs = with_callbacks(self, args, kwargs, [position])
        # A failed `fit` frees its input iterator before it raises (see
        # `_FitInputs`): nothing waits on it later. The links its callbacks
        # registered on the train function go with it (`chain.fitting`).
        try:
            with (self._fit_inputs().freed_on_failure(self),
                  chain.fitting(self)):
                return super().fit(*args, **kwargs)
        finally:
            # A failed `fit` ends without `on_train_end`.
            position.clear()

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
        super().compile(*args, jit_compile=False, **kwargs)
        if self.compiles_replicas:
            self.jit_compile = jit_compile

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
        function on the replica's device (`device_pass.compiled_on`); the
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
