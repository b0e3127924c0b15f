"""The engines' training step: Keras's, with the update gated on finite data.

`train_step(model, data, ...)` is what every engine's model runs as
`train_step` (`multigpu.template.TemplateBacked`): the forward pass, the
loss and its tracker, the gradients, the update and the metrics, as
`keras.Model.train_step` does them on TensorFlow, with two differences.

* With the NaN/inf guard on (`model.check_finite`), each replica checks its
  share of the batch first (`multigpu.finite`), and the update runs only
  when every share is finite; on a bad batch, what the forward pass wrote
  (the model's non-trainable variables and the metrics) is put back, and
  the findings go to the model's `finite.Record`.
* Under a `tf.distribute` strategy (the mirrored engine), the update runs
  in cross-replica context, once, after the gradients are summed with
  `strategy.extended.batch_reduce_to`. Keras's optimizer then needs no
  `merge_call` inside a `tf.cond` of a replica (a cond whose branches
  synchronise the replicas deadlocks or fails), so the gate and Keras's own
  `gradient_accumulation_steps` both work; every all-reduce of the step
  runs to its end, bad batch or not.

Without a strategy (the replicate and model-parallel engines) the gate is
one `tf.cond` around `optimizer.apply`.
"""

import warnings

import keras
import tensorflow as tf

from multigpu import finite, internals


def _snapshot(variables):
    """The values of `variables` now (reads; the writes that follow do not
    change them)."""
    return [tf.identity(v.value) for v in variables]


def _put_back(variables, values):
    return tf.group([v.assign(value) for v, value in zip(variables, values)])


def _apply(optimizer, grads, variables):
    optimizer.apply(grads, variables)
    return tf.no_op()


def _gate_here(model, grads, variables, finite_now, counts, state, record,
               layout):
    """The gate without a strategy: update, or put the state back."""
    ok = finite_now
    if record is None:
        return _apply(model.optimizer, grads, variables), ok
    ok = tf.logical_and(finite_now, tf.logical_not(record.failed()))
    state_variables, saved = state
    update = tf.cond(
        ok, lambda: _apply(model.optimizer, grads, variables),
        lambda: _put_back(state_variables, saved))
    with tf.control_dependencies([update]):
        noted = record.note(finite_now, counts[None], layout)
    with tf.control_dependencies([noted]):
        return update, tf.identity(ok)


def _gate_across(model, grads, variables, finite_now, counts, state, record,
                 layout):
    """The gate under a strategy, from a replica: one cross-replica update."""
    optimizer = model.optimizer

    def across(strategy, grads, finite_now, counts, saved):
        local = strategy.experimental_local_results
        every = tf.reduce_all(tf.stack(local(finite_now)))

        def apply():
            # Keras's `apply` in every replica, its all-reduce included, as
            # Keras's LossScaleOptimizer runs it: from this cross-replica
            # branch, not from a `tf.cond` of the replicas.
            strategy.extended.call_for_each_replica(
                _apply, args=(optimizer, grads, variables))
            return tf.no_op()

        if record is None:
            return apply(), every
        ok = tf.logical_and(every, tf.logical_not(record.failed()))
        state_variables = state[0]

        def put_back():
            return tf.group([
                strategy.extended.update(
                    v.value, lambda var, value: var.assign(value),
                    args=(value,), group=True)
                for v, value in zip(state_variables, saved)])

        update = tf.cond(ok, apply, put_back)
        with tf.control_dependencies([update]):
            noted = record.note(every, tf.stack(local(counts)), layout)
        with tf.control_dependencies([noted]):
            return update, tf.identity(ok)

    saved = state[1] if state else []
    return tf.distribute.get_replica_context().merge_call(
        across, args=(grads, finite_now, counts, saved))


def train_step(model, data, record=None, input_names=(), output_names=()):
    """One training step of an engine's `model` on its share of `data`.

    Args:
        model: A compiled model of an engine (`TemplateBacked`).
        data: The batch (a replica's share under a strategy): `x`,
            `(x, y)` or `(x, y, sample_weight)`.
        record: The model's `finite.Record`, or None to train without the
            NaN/inf check.
        input_names: The model's input names (see `finite.checked_leaves`).
        output_names: The model's output names.

    Returns:
        The logs, as `keras.Model.train_step` returns them.

    Example:
    >>> def train_step(self, data):
    ...     return training_step.train_step(self, data, self._record)
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    finite_now, counts, layout, state = tf.constant(True), None, 0, None
    metrics_state = None
    if record is not None:
        leaves = finite.checked_leaves(x, y, sample_weight, input_names,
                                       output_names)
        finite_now, counts = finite.check([t for _, t in leaves])
        layout = record.layout(leaves)
        x, y, sample_weight = keras.tree.map_structure(
            lambda t: finite.sanitized(t, finite_now),
            (x, y, sample_weight))
        state_variables = list(model.non_trainable_variables)
        state = (state_variables, _snapshot(state_variables))
        metrics_state = (list(model.metrics_variables),
                         _snapshot(model.metrics_variables))

    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred,
                                  sample_weight=sample_weight, training=True)
        rows = tf.shape(next(t for t in keras.tree.flatten(x)
                             if t is not None))[0]
        # `compute_loss` divides by the replica count (the gradients are
        # summed over replicas); the tracker reports the loss itself.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        internals.loss_tracker(model).update_state(
            loss * tf.cast(replicas, loss.dtype), sample_weight=rows)
        if model.optimizer is not None:
            loss = model.optimizer.scale_loss(loss)

    variables = model.trainable_variables
    ok = finite_now
    if variables:
        grads = tape.gradient(loss, variables)
        gate = (_gate_across if tf.distribute.has_strategy() and not
                tf.distribute.in_cross_replica_context() else _gate_here)
        _, ok = gate(model, grads, variables, finite_now, counts, state,
                     record, layout)
    else:
        warnings.warn("The model does not have any trainable weights.",
                      stacklevel=2)
    logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    if metrics_state is not None:
        with tf.control_dependencies(keras.tree.flatten(logs)):
            tf.cond(ok, tf.no_op,
                    lambda: _put_back(*metrics_state))
    return logs
