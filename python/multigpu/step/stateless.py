"""The guarded training step's forward pass, run before the guard's verdict.

The engines' guarded step (`multigpu.step.train_step`) runs the forward pass,
the loss and the gradients on the variables' values read once at the start
of the step, inside a `StepScope` (a `keras.StatelessScope`): what the pass
writes (BatchNormalization's moving statistics, Dropout's seed) is captured
instead of written. Only the writes and the update wait for the NaN/inf
verdict; the reads, the copies to the devices and the forward pass do not.

Three places of the forward path need the scope's help:

* each replica's pass runs in a scope of its own inside the step's
  (`StepScope.within`, `forward.held_effects`): the losses its layers add
  and the values it writes become outputs of the replica's function, and
  reach the step's scope from there;
* a `tf.cond` whose branches write (the pipeline's cond on an empty
  micro-batch, `forward.inference_on_empty_share`) returns the values its
  branches wrote as outputs of the cond (`StepScope.cond`): tensors made
  inside a branch cannot be used outside it;
* a function with a custom gradient (`device_pass.on_device`) takes the values
  of the trainable variables it read as inputs (`StepScope.reading`), so
  that the step's tape reaches them.

The forward pass may run on a bad batch. The only way it can fail there,
before the verdict, is a NaN or inf cast to an integer and used as an
index (floats fed to an Embedding, sparse labels given as floats): the
cast gives -2**31, which a bounds-checked kernel (`Gather`, sparse
cross-entropy on CPU) rejects with TensorFlow's error instead of the
guard's. While the pass is traced (`casts_of_finite`), every cast from a
floating-point to an integer type casts the value with NaN and inf set to
zero instead: a finite value casts as before, and the index tensors are
small, so this costs next to nothing, where cleaning the whole batch
costs 1-3% of an image model's step.
"""

import contextlib
import threading
import warnings

import keras
import tensorflow as tf

from multigpu import internals, tensorflow_internals
from multigpu.messages import setting


def current():
    """The `StepScope` the step is traced in, or None."""
    scope = internals.stateless_scope()
    return scope if isinstance(scope, StepScope) else None


class StepScope(keras.StatelessScope):
    """A stateless scope over a model's variables that remembers its writes.

    Args:
        trainable: The trainable variables (Keras variables); their values
            are read here, as `trainable_values`.
        others: The other variables the pass reads or writes (the
            non-trainable ones: moving statistics, seed states).
        values: The values to map the variables to (trainable first);
            None to read them.
        parent: The scope this one is nested in (a branch of `cond`): it
            shares its readers.
    """

    def __init__(self, trainable, others, values=None, parent=None):
        self.trainable = list(trainable)
        self.others = list(others)
        variables = self.trainable + self.others
        if values is None:
            values = [internals.stored_value(v) for v in variables]
        super().__init__(collect_losses=True)
        # Set as they are: `keras.StatelessScope` would cast them to the
        # dtype of an autocast scope the branches of `cond` are traced in.
        self.state_mapping = {id(v): value
                              for v, value in zip(variables, values)}
        self.trainable_values = [self.state_mapping[id(v)]
                                 for v in self.trainable]
        # The variables written in the scope, by id, in order.
        self.written = {}
        # Whether reads of unmapped non-trainable variables are kept (see
        # `within`).
        self._snapshots = False
        self.readers = parent.readers if parent is not None else []

    @classmethod
    def within(cls, parent):
        """A scope for one pass inside `parent` (any stateless scope, or None).

        It reads `parent`'s values (noting its reads with `parent`'s
        readers, when `parent` is a `StepScope`) and the variables
        themselves where `parent` maps none; it collects the pass's losses
        and writes for itself, leaving `parent` untouched.

        Args:
            parent: The scope the pass is traced in, or None.

        Returns:
            A new `StepScope`, to enter.
        """
        scope = cls([], [], values=[],
                    parent=parent if isinstance(parent, StepScope) else None)
        if parent is not None:
            scope.state_mapping.update(parent.state_mapping)
        else:
            scope._snapshots = True
        return scope

    def get_current_value(self, variable):
        # Keras's `Variable.value` asks here: a read.
        for reader in self.readers:
            reader.add(id(variable))
        value = self.state_mapping.get(id(variable), None)
        if value is None and self._snapshots and not variable.trainable and (
                internals.initialized(variable)):
            # A scope with no step's scope around it (`within(None)`)
            # reads a non-trainable variable once, where the pass first
            # reads it: left to Keras, the read was of the variable itself,
            # and the write the caller commits after the pass could reach
            # it first (a Dropout seed drawn after its own increment).
            value = internals.stored_value(variable)
            self.state_mapping[id(variable)] = value
        return value

    def add_update(self, update):
        variable, _ = update
        self.written.setdefault(id(variable), variable)
        super().add_update(update)

    def value_of(self, variable):
        """The variable's value in the scope (not counted as a read)."""
        return self.state_mapping.get(id(variable), None)

    @contextlib.contextmanager
    def reading(self):
        """Collects the ids of the variables whose values the block reads."""
        read = set()
        self.readers.append(read)
        try:
            yield read
        finally:
            self.readers.remove(read)

    def updates(self):
        """`[(variable, value)]` of what the scope's pass wrote."""
        return [(v, self.state_mapping[key])
                for key, v in self.written.items()]

    def cond(self, pred, true_fn, false_fn):
        """`tf.cond(pred, true_fn, false_fn)` whose branches may write.

        Each branch runs in a scope of its own over this scope's current
        values; the values the first branch (`true_fn`) wrote are outputs
        of the cond, the second branch passing them on unchanged unless it
        wrote them too, and become this scope's writes.

        Args:
            pred: A boolean scalar tensor.
            true_fn, false_fn: Functions returning lists of tensors.

        Returns:
            The branch's outputs, as `tf.cond` returns them.

        Raises:
            NotImplementedError: if the second branch writes a variable
                the first did not, or a branch adds a loss (`add_loss`).
        """
        written = []  # filled by the first branch traced (true_fn)
        keys = list(self.state_mapping)
        variables = {id(v): v for v in self.trainable + self.others}
        variables.update(self.written)

        def branch(fn, first):
            def run():
                nested = StepScope(
                    [], [variables[k] for k in keys if k in variables],
                    [self.state_mapping[k] for k in keys if k in variables],
                    parent=self)
                with nested:
                    outputs = list(fn())
                if nested.losses:
                    # Only the pipeline's micro-batches still run a cond
                    # on an empty share; the data-parallel engines pad instead
                    # (`forward.padded_on_empty_share`).
                    raise NotImplementedError(
                        "multigpu: a loss added (add_loss, "
                        "activity_regularizer) inside the branch for an "
                        "empty micro-batch of a pipeline stage, in the "
                        "NaN-guarded step. Train the model with "
                        "multi_gpu_model(), whose engines take such losses, "
                        f"or set {setting('check_finite', False)}")
                if first:
                    written[:] = list(nested.written.values())
                elif any(k not in {id(v) for v in written}
                         for k in nested.written):
                    raise NotImplementedError(
                        "multigpu: the branch for no rows writes a variable "
                        "that the training branch does not")
                # A variable outside the mapping that only the first
                # branch wrote (an unseeded `keras.random` draw's global
                # seed) is passed on as it is stored.
                return outputs + [
                    nested.state_mapping[id(v)] if id(v) in
                    nested.state_mapping else internals.stored_value(v)
                    for v in written]
            return run

        outputs = tf.cond(pred, branch(true_fn, True), branch(false_fn, False))
        outputs = list(outputs)
        count = len(outputs) - len(written)
        for variable, value in zip(written, outputs[count:]):
            self.add_update((variable, value))
        return outputs[:count]


# Whether this thread traces a forward pass in `casts_of_finite`: the
# callback list is shared with other replicas' threads (`op_callback`).
_tracing = threading.local()

# Variable writes that bypass a stateless scope (a raw `tf.Variable`).
_WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def _finite_before_integer_cast(op_type, inputs, attrs, outputs,
                                op_name=None, graph=None):
    """An op callback: see `casts_of_finite`."""
    # Returns `outputs` when it leaves them: TensorFlow hands a callback's
    # return value to the next callback as its outputs.
    if graph is None or outputs is None or not getattr(_tracing, "depth", 0):
        return outputs
    if op_type in _WRITES or op_type.startswith("ResourceScatter"):
        warnings.warn(
            f"multigpu: the guarded training step's forward pass writes a "
            f"tf.Variable directly (op {op_name!r}). That write is not held "
            f"back on a batch with NaN or inf; create the variable with a "
            f"layer's `add_weight` (a Keras variable) so that it is.",
            stacklevel=2)
        return outputs
    if op_type != "Cast":
        return outputs
    source, target = inputs[0], outputs[0]
    if not (source.dtype.is_floating and target.dtype.is_integer):
        return outputs
    finite = tf.where(tf.math.is_finite(source), source,
                      tf.zeros([], source.dtype))
    return [tf.cast(finite, target.dtype)]


@contextlib.contextmanager
def casts_of_finite():
    """A context in which float-to-integer casts map NaN and inf to zero.

    For tracing the guarded step's forward pass (see the module's
    docstring); it also warns of writes to raw `tf.Variable`s, which the
    stateless scope cannot hold back.

    Example:
    >>> with StepScope(trainable, others), casts_of_finite():
    ...     y_pred = model(x, training=True)
    """
    if tf.executing_eagerly():
        # Nothing is traced (`run_eagerly=True`); registered eagerly, an op
        # callback would also switch TensorFlow's eager execution to its
        # slower path for the block.
        yield
        return
    _tracing.depth = getattr(_tracing, "depth", 0) + 1
    try:
        with tensorflow_internals.op_callback(_finite_before_integer_cast):
            yield
    finally:
        _tracing.depth -= 1
