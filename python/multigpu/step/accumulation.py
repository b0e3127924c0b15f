"""Keras's gradient accumulation on the mirrored engine.

`keras.optimizers.Optimizer(gradient_accumulation_steps=k)` sums the
gradients of `k` steps and updates the weights with their mean on every
`k`-th step, inside a `tf.cond` of each replica whose branches synchronise
the replicas (`merge_call`), which `MirroredStrategy` refuses. The mirrored
engine compiles its replicas with the same optimizer without accumulation
and accumulates here instead (`Accumulation`), from the training step's
cross-replica branch (`multigpu.step.train_step`):

* on the first `k - 1` steps each replica adds its own gradients to its
  copy of the sums (no all-reduce);
* on the `k`-th, each replica hands `(sums + gradients) / k` to Keras's
  `apply`, whose all-reduce adds the replicas' shares, and the sums are
  reset.

The update is Keras's: the mean over the `k` steps of the gradients summed
over the replicas, and the optimizer's `iterations` counts updates, as
Keras's `iterations` does with accumulation.
"""

import tensorflow as tf


def accumulation_steps(optimizer):
    """`optimizer`'s `gradient_accumulation_steps` (None for a name)."""
    return getattr(optimizer, "gradient_accumulation_steps", None) or None


def without_accumulation(optimizer):
    """A new optimizer with `optimizer`'s config but no accumulation.

    Args:
        optimizer: A `keras.optimizers.Optimizer` with
            `gradient_accumulation_steps`.

    Returns:
        A new, unbuilt optimizer of the same class.

    Example:
    >>> inner = without_accumulation(keras.optimizers.SGD(
    ...     0.1, gradient_accumulation_steps=2))
    >>> inner.gradient_accumulation_steps is None
    True
    """
    config = optimizer.get_config()
    config["gradient_accumulation_steps"] = None
    return type(optimizer).from_config(config)


class Accumulation:
    """Sums of gradients over steps, one copy per replica.

    Args:
        steps: `gradient_accumulation_steps` (an int >= 2).
        variables: The trainable variables (Keras variables) the gradients
            are for.
        strategy: The strategy whose replicas train them; the sums are
            created in its scope.
    """

    def __init__(self, steps, variables, strategy):
        self.steps = int(steps)
        with tf.init_scope(), strategy.scope():
            self.taken = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="accumulated_steps")
            self.sums = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                            name="accumulated_gradients")
                for v in variables]

    def update(self, strategy, apply, grads):
        """One step: add the gradients, or apply their mean (traced).

        Called in cross-replica context.

        Args:
            strategy: The strategy.
            apply: A function of one replica's gradients that applies them
                (Keras's `optimizer.apply`, run in replica context).
            grads: The replicas' gradients (`PerReplica` values or None).

        Returns:
            The op.
        """
        last = tf.equal((self.taken + 1) % self.steps, 0)

        def add():
            return tf.group([
                strategy.extended.update(
                    total, lambda t, g: t.assign_add(tf.convert_to_tensor(g)),
                    args=(g,), group=True)
                for total, g in zip(self.sums, grads) if g is not None])

        def mean():
            strategy.extended.call_for_each_replica(
                self._apply_mean, args=(apply, grads))
            return self._reset()

        stepped = tf.cond(last, mean, add)
        with tf.control_dependencies([stepped]):
            return tf.group(self.taken.assign_add(1))

    def _apply_mean(self, apply, grads):
        """In a replica: its share of the mean gradient, applied."""
        means = [None if g is None else
                 (total.read_value() + tf.convert_to_tensor(g)) / self.steps
                 for total, g in zip(self.sums, grads)]
        apply(means)

    def _reset(self):
        return tf.group([total.assign(tf.zeros_like(total))
                         for total in self.sums])
