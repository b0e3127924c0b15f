"""The engines' training step: Keras's, with the update gated on finite data.

`train_step(model, data, ...)` is what every engine's model runs as
`train_step` (`multigpu.template.TemplateBacked`): the forward pass, the
loss and its tracker, the gradients, the update and the metrics, as
`keras.Model.train_step` does them on TensorFlow, with two differences.

* With the NaN/inf guard on (`model.check_finite`), each replica checks its
  share of the batch first (`multigpu.finite`), and the update runs inside
  a `tf.cond`, only when every share is finite; on a bad batch the other
  branch puts back what the forward pass wrote (the model's non-trainable
  variables) and writes the findings to the model's `finite.Record`.
* Under a `tf.distribute` strategy (the mirrored engine), that `tf.cond`
  runs in cross-replica context, in one `merge_call`, and its branch calls
  Keras's `apply` in every replica (all-reduce included), as Keras's
  `LossScaleOptimizer` does: a `tf.cond` of a replica whose branch
  synchronises the replicas is refused by `MirroredStrategy`. The same
  branch runs the mirrored engine's gradient accumulation
  (`multigpu.accumulation`). No assertion ends a step: every collective
  runs to its end, bad batch or not.

Without a strategy (the replicate and model-parallel engines) the gate is
one `tf.cond` around `optimizer.apply`.
"""

import warnings

import keras
import tensorflow as tf

from multigpu import finite, internals
from multigpu import gradients as gradients_lib


def _snapshot(variables):
    """The values of `variables` now (reads; the writes that follow do not
    change them)."""
    return [tf.identity(v.value) for v in variables]


def _put_back(variables, values):
    return tf.group([v.assign(value) for v, value in zip(variables, values)])


def _apply(optimizer, grads, variables):
    # Traced in a branch of the gate's `tf.cond` (a graph of its own): the
    # custom gradients the update registers belong to its ops.
    with gradients_lib.gradients_owned_by_ops():
        optimizer.apply(grads, variables)
    return tf.no_op()


def _gate_here(model, grads, variables, finite_now, checked, state, record,
               layout):
    """The gate without a strategy: update, or put the state back."""
    ok = tf.logical_and(finite_now, tf.logical_not(record.failed()))
    state_variables, saved = state

    def update():
        return tf.group(_apply(model.optimizer, grads, variables),
                        record.count())

    def skip():
        return tf.group(_put_back(state_variables, saved),
                        record.note(finite.located([checked]), layout))

    gated = tf.cond(ok, update, skip)
    with tf.control_dependencies([gated]):
        return record.status()


def _gate_across(model, grads, variables, finite_now, checked, state, record,
                 layout, accumulation=None):
    """The gate under a strategy, from a replica: one cross-replica branch.

    Without a `record` (no NaN/inf check) only the update runs there, for
    an `accumulation.Accumulation`.
    """
    optimizer = model.optimizer

    def across(strategy, grads, finite_now, checked, saved):
        local = strategy.experimental_local_results

        def apply():
            # Keras's `apply` in every replica, its all-reduce included, as
            # Keras's LossScaleOptimizer runs it: from this cross-replica
            # branch, not from a `tf.cond` of the replicas.
            if accumulation is not None:
                return accumulation.update(
                    strategy, lambda g: _apply(optimizer, g, variables), grads)
            strategy.extended.call_for_each_replica(
                _apply, args=(optimizer, grads, variables))
            return tf.no_op()

        if record is None:
            apply()
            return None
        every = tf.reduce_all(tf.stack(local(finite_now)))
        ok = tf.logical_and(every, tf.logical_not(record.failed()))

        def update():
            return tf.group(apply(), record.count())

        def skip():
            put_back = [
                strategy.extended.update(
                    v.value, lambda var, value: var.assign(value),
                    args=(value,), group=True)
                for v, value in zip(state[0], saved)]
            shares = zip(*[local(t) for t in checked]) if checked else [
                () for _ in local(finite_now)]
            found = finite.located([list(share) for share in shares])
            return tf.group(put_back, record.note(found, layout))

        gated = tf.cond(ok, update, skip)
        with tf.control_dependencies([gated]):
            return record.status()

    saved = state[1] if state else []
    return tf.distribute.get_replica_context().merge_call(
        across, args=(grads, finite_now, checked, saved))


def train_step(model, data, record=None, input_names=(), output_names=(),
               accumulation=None):
    """One training step of an engine's `model` on its share of `data`.

    Args:
        model: A compiled model of an engine (`TemplateBacked`).
        data: The batch (a replica's share under a strategy): `x`,
            `(x, y)` or `(x, y, sample_weight)`.
        record: The model's `finite.Record`, or None to train without the
            NaN/inf check.
        input_names: The model's input names (see `finite.checked_leaves`).
        output_names: The model's output names.
        accumulation: Under a strategy, the model's
            `accumulation.Accumulation`, or None.

    Returns:
        The logs, as `keras.Model.train_step` returns them.

    Example:
    >>> def train_step(self, data):
    ...     return training_step.train_step(self, data, self._record)
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    finite_now, checked, layout, state = tf.constant(True), [], 0, None
    if record is not None:
        leaves = finite.checked_leaves(x, y, sample_weight, input_names,
                                       output_names)
        checked = [t for _, t in leaves]
        finite_now = finite.check(checked)
        layout = record.layout(leaves)

        def clean(structure):
            return keras.tree.map_structure(
                lambda t: (finite.sanitized(t, finite_now)
                           if finite.is_checked(t) else t), structure)

        y, sample_weight = clean((y, sample_weight))
        if finite.reads_indices(model):
            x = clean(x)
        state_variables = list(model.non_trainable_variables)
        state = (state_variables, _snapshot(state_variables))

    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred,
                                  sample_weight=sample_weight, training=True)
        scaled = (loss if model.optimizer is None
                  else model.optimizer.scale_loss(loss))

    variables = model.trainable_variables
    if not variables:
        warnings.warn("The model does not have any trainable weights.",
                      stacklevel=2)
    grads = tape.gradient(scaled, variables) if variables else []
    across = (tf.distribute.has_strategy()
              and not tf.distribute.in_cross_replica_context())
    if across and (record is not None or accumulation is not None):
        status = _gate_across(model, grads, variables, finite_now, checked,
                              state, record, layout, accumulation)
    elif record is not None:
        status = _gate_here(model, grads, variables, finite_now, checked,
                            state, record, layout)
    else:
        model.optimizer.apply(grads, variables)

    def tracked():
        rows = tf.shape(next(t for t in keras.tree.flatten(x)
                             if t is not None))[0]
        # `compute_loss` divides by the replica count (the gradients are
        # summed over replicas); the tracker reports the loss itself.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        internals.loss_tracker(model).update_state(
            loss * tf.cast(replicas, loss.dtype), sample_weight=rows)
        return model.compute_metrics(x, y, y_pred,
                                     sample_weight=sample_weight)

    # On a bad batch the metrics take in its step too (they are reset
    # before the next epoch, evaluation or `train_on_batch`).
    logs = tracked()
    if record is None:
        return logs
    return {**logs, finite.STATUS: status}
