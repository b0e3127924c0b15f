"""The engines' training step: Keras's, run only on finite data.

`train_step(model, data, ...)` is what the TensorFlow engines' models run
as `train_step` (`multigpu.engines.tensorflow.trainer.TensorFlowTrainer`): the forward pass, the
loss and its tracker, the gradients, the update and the metrics, as
`keras.Model.train_step` does them on TensorFlow, with two differences.

* With the NaN/inf guard on (`model.check_finite`), the batch is checked
  (`multigpu.step.guard`), and every write of the step waits for the verdict:
  a `tf.debugging.Assert` that fails on a bad batch, after its findings
  were written to the model's `guard.Record`. The forward pass, the loss
  and the gradients run beside the check, on the variables' values read at
  the start of the step (`_guarded_step`, `multigpu.step.stateless`): what they
  write is captured and written after the verdict. A bad batch thus
  writes nothing (BatchNormalization's statistics, Dropout's seed, the
  weights, the optimizer, the metrics). The train function then raises
  `nonfinite.NonFiniteInputError` from the record (`guard.Reporting`). A
  batch with no floating-point tensor (integer tokens and labels) has
  nothing to check, and its step is Keras's.
* Under a `tf.distribute` strategy (the mirrored engine) each replica checks
  its share, and the verdict is taken once for all of them, in
  cross-replica context (one `merge_call`): every replica's update waits
  for the one assertion, so on a bad batch no replica starts a collective
  of the update that the others would never join; and the assertion waits
  for each replica's loss and gradients, so it cuts short no collective of
  the forward or backward pass (the loss's all-reduce of the row counts, a
  synchronised BatchNormalization's). A collective cut short leaves the
  process's collective executor cancelled for every later step. The
  update runs once, on the replicas' summed gradient, in another
  cross-replica call (`apply_once`): Keras's optimizer, with every option
  it has, sees the whole batch's gradient as on one device.

Example:
>>> class Engine(keras.Model):
...     def train_step(self, data):
...         return train_step(self, data, record=self.record)
"""

import inspect
import warnings

import keras
import tensorflow as tf

from multigpu import internals, tensorflow_internals
from multigpu.step import gradients as gradients_lib
from multigpu.step import guard, nonfinite, stateless


def _verdict(ok, checked, record, layout, counting):
    """The guard's verdict on a replica's share (traced, replica context).

    Each replica keeps its own bad share; the assertion is one for all, in
    cross-replica context (a `merge_call`; without a strategy, here).

    Args:
        ok: `guard.check(checked)`.
        checked: The replica's checked tensors.
        record: The model's `guard.Record`.
        layout: The index of the checked tensors' layout in the record.
        counting: Whether to count the step (several steps per call).

    Returns:
        `record.asserted`'s verdict, the same in every replica.
    """
    ok = record.noted(ok, checked, layout)

    def across(strategy, ok):
        return record.asserted(
            list(strategy.experimental_local_results(ok)), counting)

    return tf.distribute.get_replica_context().merge_call(across, args=(ok,))


def train_step(model, data, record=None, input_names=(), output_names=(),
               weigh_rows=False):
    """One training step of an engine's `model` on its share of `data`.

    Args:
        model: A compiled model of an engine (`TensorFlowTrainer`), or any
            compiled model whose step is Keras's (`fit_distributed`).
        data: The batch (a replica's share under a strategy): `x`,
            `(x, y)` or `(x, y, sample_weight)`.
        record: The model's `guard.Record`, or None to train without the
            NaN/inf check.
        input_names: The model's input names (see `nonfinite.checked_leaves`).
        output_names: The model's output names.
        weigh_rows: Whether the gradient weighs the replicas' rows as one
            device does (`weighed_by_rows`), under a strategy.

    Returns:
        The logs, as `keras.Model.train_step` returns them.

    Example:
    >>> def train_step(self, data):
    ...     return training_step.train_step(self, data, self._record)
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    leaves = [] if record is None else nonfinite.checked_leaves(
        x, y, sample_weight, guard.is_checked, input_names, output_names)
    if not leaves:
        # Unguarded, or nothing to check (integer tokens and labels).
        return _step(model, x, y, sample_weight, weigh_rows)
    checked = [t for _, t in leaves]
    # With one step per call, a failed call names its first step: nothing
    # to count.
    counting = (getattr(model, "steps_per_execution", 1) or 1) > 1
    return _guarded_step(model, x, y, sample_weight, checked,
                         record, record.layout(leaves), counting, weigh_rows)


def weighed_by_rows(loss, rows):
    """A replica's loss whose gradient is its share of one device's.

    Under a strategy every replica averages the loss over its own rows
    (and Keras divides it by the number of replicas), so summing the
    replicas' gradients would weigh the rows of a smaller share more: a
    batch of 10 on 4 replicas splits 3/3/2/2. The gradient of replica r is
    scaled by `rows_r * replicas / rows`, where `rows` is the batch's row
    count (one all-reduce of the replicas' counts, which depends on no
    other op of the step): every row then weighs `1 / rows`, and the sum
    of the replicas' gradients (`apply_once`) is the gradient of the mean
    over all rows, as on one device. The loss value (and so the reported
    loss) is unchanged.

    The weight is applied to the loss, before the backward pass, because
    a gradient may cross replicas there (a synchronised
    BatchNormalization's all-reduce carries every replica's loss back to
    each replica's variables). It is close to 1, so the backward pass
    runs on the magnitudes of one device's: under `mixed_float16` it runs
    in float16 on the loss scale's multiple of the loss, and a loss as
    large as the batch's row count times one device's overflowed float16
    where one device's did not, making the dynamic loss scale skip steps
    that one device applies.

    Args:
        loss: The replica's loss, as Keras's `compute_loss` returns it.
        rows: The number of rows of the replica's share of the batch.

    Returns:
        `loss` itself outside a replica context of several replicas;
        otherwise a tensor of the same value whose gradient is reweighed.

    Example:
    >>> loss = weighed_by_rows(loss, rows)
    >>> ...  # the gradients
    >>> apply_once(optimizer, grads, variables)
    """
    if not _in_replicas():
        return loss
    context = tf.distribute.get_replica_context()
    rows = tf.cast(rows, tf.float32)
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, rows)
    weight = tf.stop_gradient(tf.cast(
        rows * context.num_replicas_in_sync / tf.maximum(total, 1.0),
        loss.dtype))
    return loss * weight + tf.stop_gradient(loss * (1.0 - weight))


def _in_a_replica():
    """Whether this is traced in a replica of a strategy."""
    return tf.distribute.has_strategy() and (
        not tf.distribute.in_cross_replica_context())


def _in_replicas():
    """Whether this is traced in a replica of several."""
    return _in_a_replica() and (
        tf.distribute.get_replica_context().num_replicas_in_sync > 1)


def _guarded_step(model, x, y, sample_weight, checked,
                  record, layout, counting, weigh_rows):
    """Keras's step with its writes waiting for the NaN/inf verdict (traced).

    The forward pass, the loss and the gradients run on the variables'
    values read at the start of the step (`stateless.StepScope`), beside
    the check of `checked`; what the pass writes (moving statistics,
    seeds) is captured. The writes, the update and the metrics wait for
    the verdict: a bad batch writes nothing.

    Returns:
        The logs.
    """
    ok = guard.check(checked)
    eager = tf.executing_eagerly()
    if eager:
        # Run eagerly (`run_eagerly=True`), ops run in the program's order
        # and `casts_of_finite` sees no graph: the verdict comes first, so
        # that a NaN read as an index fails the guard's way.
        passed = _verdict(ok, checked, record, layout, counting)
    variables = _trainable(model)
    scope = stateless.StepScope(variables, model.non_trainable_variables)
    with scope, stateless.casts_of_finite():
        y_pred, loss, grads = _loss_and_gradients(
            model, x, y, sample_weight, scope.trainable_values, weigh_rows,
            watch=True)

    if not eager:
        if tf.distribute.has_strategy():
            # A failed assertion cancels the step, and a collective cut
            # short leaves the process's collective executor cancelled for
            # every later step: the replica's loss and gradients come after
            # every collective of its forward and backward pass.
            done = [t for t in tf.nest.flatten([loss, grads],
                                               expand_composites=True)
                    if t is not None]
            with tf.control_dependencies(done):
                ok = tf.identity(ok)
        passed = _verdict(ok, checked, record, layout, counting)
    with tf.control_dependencies([passed]):
        for variable, value in scope.updates():
            variable.assign(value)
        apply_once(model.optimizer, grads, variables)
        return _track(model, x, y, y_pred, sample_weight, loss)


def _step(model, x, y, sample_weight, weigh_rows):
    """Keras's step: forward, loss, gradients, update, metrics (traced)."""
    variables = _trainable(model)
    y_pred, loss, grads = _loss_and_gradients(
        model, x, y, sample_weight, variables, weigh_rows)
    apply_once(model.optimizer, grads, variables)
    return _track(model, x, y, y_pred, sample_weight, loss)


def _trainable(model):
    """The model's trainable variables; Keras's warning when there are none."""
    variables = model.trainable_variables
    if not variables:
        # Names the caller of `train_step` (past `_step` or `_guarded_step`).
        warnings.warn("The model does not have any trainable weights.",
                      stacklevel=4)
    return variables


def _loss_and_gradients(model, x, y, sample_weight, sources, weigh_rows,
                        watch=False):
    """The forward pass, the loss and its gradients over `sources` (traced).

    Args:
        sources: The trainable variables, or the values standing for them
            in a `stateless.StepScope` (tensors, which the tape must be
            told to watch: `watch=True`).
        weigh_rows: Whether the loss goes through `weighed_by_rows`.

    Returns:
        `(y_pred, loss, grads)`.
    """
    with tf.GradientTape() as tape:
        if watch:
            tape.watch(sources)
        # A `call` without `training` is called without it, as Keras's
        # step does (its layers then take their own default).
        y_pred = (model(x, training=True) if _takes_training(model.call)
                  else model(x))
        loss = _compute_loss(model, x, y, y_pred, sample_weight)
        if weigh_rows and loss is not None and _in_replicas():
            first = keras.tree.flatten(y_pred if y_pred is not None else x)[0]
            loss = weighed_by_rows(loss, tf.shape(first)[0])
        scaled = (loss if model.optimizer is None
                  else model.optimizer.scale_loss(loss))
    grads = tape.gradient(scaled, sources) if sources else []
    return y_pred, loss, _zero_when_no_rows(grads, x)


def _takes_training(method):
    """Whether `method` has a `training` argument (Keras's test of it)."""
    return "training" in inspect.signature(method).parameters


def _compute_loss(model, x, y, y_pred, sample_weight):
    """`model.compute_loss` in training (traced).

    A `compute_loss` without a `training` argument (Keras's signature
    before 3.3, kept by some subclasses) is called without it, as Keras's
    own step calls it.
    """
    if _takes_training(model.compute_loss):
        return model.compute_loss(x, y, y_pred, sample_weight, training=True)
    return model.compute_loss(x, y, y_pred, sample_weight)


def _zero_when_no_rows(grads, x):
    """A replica's gradients, zero when its share of the batch has no rows.

    Under a strategy (the mirrored engine) a replica whose share is empty
    runs its forward pass on one padded row of zeros
    (`forward.padded_on_empty_share`), whose outputs and loss are cut away.
    A layer may still make NaN or inf of that row (a masked average over a
    row that is all padding divides 0 by 0), and the zero gradient of the
    cut outputs, back-propagated through it, becomes 0 * inf = NaN. Such a
    replica contributes nothing to the step, so its gradients are zeros;
    a replica with rows keeps its own (a select, no arithmetic).
    """
    if not grads or not _in_a_replica():
        return grads
    rows = tf.shape(next(t for t in keras.tree.flatten(x)
                         if t is not None))[0]
    has_rows = rows > 0

    def kept(grad):
        if grad is None:
            return None
        if isinstance(grad, tf.IndexedSlices):
            values = tf.where(has_rows, grad.values,
                              tf.zeros_like(grad.values))
            return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
        return tf.where(has_rows, grad, tf.zeros_like(grad))

    return [kept(grad) for grad in grads]


def apply_once(optimizer, grads, variables):
    """The optimizer's update with the whole batch's gradient, once (traced).

    Without a strategy (or called in cross-replica context) this is
    `optimizer.apply`. In a replica of a strategy, Keras's own `apply`
    would clip each replica's share of the gradient before its all-reduce
    adds the shares, take one replica's verdict on a loss-scale overflow for
    all of them, and fail in `ema_overwrite_frequency`'s `tf.cond` (a
    `merge_call` inside it). Here the replicas' gradients are summed first,
    in one all-reduce, into the whole batch's gradient (`compute_loss`
    divides by the replica count, and `weighed_by_rows` weighs uneven
    shares), and the
    optimizer runs once on that sum, in cross-replica context (one
    `merge_call`): clipping, weight decay, the moving average, gradient
    accumulation and the loss scale's decision are those of one device,
    and every copy of a mirrored variable takes the same update.

    Args:
        optimizer: A Keras optimizer (a `LossScaleOptimizer` included).
        grads: This replica's gradients (None for a variable without one).
        variables: The trainable variables they are for.

    Example:
    >>> apply_once(model.optimizer, grads, model.trainable_variables)
    """
    if not _in_a_replica():
        _apply_whole(optimizer, grads, variables)
        return
    context = tf.distribute.get_replica_context()
    present = [i for i, g in enumerate(grads) if g is not None]
    reduced = [grads[i] for i in present]
    if reduced:
        reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, reduced)
    local = _computes_with_whole_gradients(optimizer)

    def across(strategy, summed):
        whole = [None] * len(grads)
        for i, grad in zip(present, summed):
            # Every replica holds the same sum. Math on the gradients in
            # cross-replica context takes one copy of it, which each
            # device's update then reads; a mirrored value lets each
            # device's update read its own copy.
            whole[i] = (strategy.experimental_local_results(grad)[0]
                        if local else grad)
        # Traced in the replicas' graph: the custom gradients the update
        # registers belong to its ops.
        with gradients_lib.gradients_owned_by_ops():
            _apply_whole(optimizer, whole, variables)

    context.merge_call(across, args=(reduced,))


# What makes an optimizer's `apply` compute with the gradients themselves,
# outside each variable's update.
_WHOLE_GRADIENT_OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm",
                           "gradient_accumulation_steps", "loss_scale_factor")


def _computes_with_whole_gradients(optimizer):
    """Whether `optimizer.apply` does math on the gradients before updating.

    Clipping, accumulation, a loss-scale factor and a `LossScaleOptimizer`'s
    check of the gradients run on the gradients as tensors; so may a
    wrapper of other optimizers. A plain optimizer only hands each
    gradient to its variable's update.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer) or isinstance(
            optimizer, (keras.optimizers.LossScaleOptimizer,
                        keras.optimizers.MultiOptimizer)):
        return True
    return any(getattr(optimizer, name, None)
               for name in _WHOLE_GRADIENT_OPTIONS)


def _apply_whole(optimizer, grads, variables):
    """`optimizer.apply`, also in cross-replica context (traced)."""
    if not tf.distribute.in_cross_replica_context():
        optimizer.apply(grads, variables)
        return
    tensorflow_internals.run_cross_replica_merge_calls_inline()
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        tensorflow_internals.apply_loss_scaled(optimizer, grads, variables)
    else:
        optimizer.apply(grads, variables)


def _track(model, x, y, y_pred, sample_weight, loss):
    """The loss tracker and the compiled metrics, updated (traced)."""
    rows = tf.shape(next(t for t in keras.tree.flatten(x)
                         if t is not None))[0]
    # `compute_loss` divides by the replica count (the gradients are
    # summed over replicas); the tracker reports the loss itself.
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    internals.loss_tracker(model).update_state(
        loss * tf.cast(replicas, loss.dtype), sample_weight=rows)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
