"""The Keras and TensorFlow internals the engines rely on still exist.

`multigpu.internals` names them; each test fails when Keras or TensorFlow
renames or drops one (the checkpoint callbacks' hooks have theirs in
`test_checkpoint_hooks.py`).
"""

import keras

from multigpu import internals, tensorflow_internals
from support.models import mlp


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


def test_is_functional_tells_a_graph_of_layers_from_code():
    assert internals.is_functional(mlp())
    subclassed = _Subclassed()
    subclassed(keras.ops.zeros((1, 3)))
    assert not internals.is_functional(subclassed)


def test_device_memory_limits_lists_gpus_only():
    limits = tensorflow_internals.device_memory_limits()
    assert isinstance(limits, dict)
    assert all(":GPU:" in name.upper() and value > 0
               for name, value in limits.items())


def test_the_loss_tracker_is_the_compiled_models_loss_metric():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    tracker = internals.loss_tracker(model)
    assert isinstance(tracker, keras.metrics.Mean)
    assert tracker.name == "loss"


def test_a_conditional_can_run_as_one_branch_function():
    import tensorflow as tf

    from multigpu.placement.graphs import executed_node_defs

    @tf.function
    def picked(x):
        ok = tf.reduce_all(x > 0)
        out = tf.cond(ok, lambda: x + 1, lambda: x - 1)
        return tensorflow_internals.run_branch_as_function(out)

    _, nodes = executed_node_defs(picked, tf.constant([1.0, 2.0]))
    ops = {node.op for _, node in nodes}
    # Left as an `If` (stateless here): no Switch per input, no dead branch.
    assert ops & {"If", "StatelessIf"} and "Switch" not in ops
    assert picked(tf.constant([-1.0])).numpy().tolist() == [-2.0]


def test_batch_normalization_takes_its_moments_from_replace_moments():
    layer = keras.layers.BatchNormalization(axis=1, momentum=0.0)
    x = keras.ops.reshape(keras.ops.arange(24, dtype="float32"), (2, 3, 4))
    layer.build(x.shape)
    assert internals.batch_norm_reduction_axes(layer) == [0, 2]
    internals.replace_moments(
        layer, lambda inputs, mask=None: (keras.ops.ones(3),
                                          keras.ops.ones(3) * 4.0))
    layer(x, training=True)
    # momentum 0: the moving statistics are the moments given.
    assert keras.ops.convert_to_numpy(layer.moving_variance).tolist() == [
        4.0, 4.0, 4.0]


def test_the_stateless_scope_and_a_variables_stored_value_are_readable():
    variable = keras.Variable(2.0)
    assert internals.stateless_scope() is None
    with keras.StatelessScope(state_mapping=[(variable, 5.0)]) as scope:
        assert internals.stateless_scope() is scope
        assert float(variable.value) == 5.0
        # As stored, not as the scope maps it.
        assert float(internals.stored_value(variable)) == 2.0


def test_an_op_callback_replaces_outputs_until_its_last_user_leaves():
    import tensorflow as tf

    def plus_one(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if op_type == "Neg" and graph is not None:
            return [outputs[0] + 1.0]
        return outputs

    @tf.function
    def negated(x):
        with tensorflow_internals.op_callback(plus_one):
            with tensorflow_internals.op_callback(plus_one):
                first = -x
            # The outer block still uses it.
            second = -x
        return first, second, -x

    first, second, third = negated(tf.constant(1.0))
    assert (float(first), float(second), float(third)) == (0.0, 0.0, -1.0)


def test_an_untracked_attribute_is_no_layer_weight_or_checkpoint_dependency():
    holder, template = keras.layers.Layer(), mlp()
    internals.set_untracked(holder, "_held", template)
    made = internals.untracked(
        holder, "_variables", make=lambda: [keras.Variable(1.0)])
    assert holder._held is template
    assert internals.untracked(holder, "_variables") is made
    assert internals.untracked(holder, "_absent") is None
    assert holder.weights == [] and holder._layers == []
    children = holder._trackable_children()
    assert "_held" not in children and "_variables" not in children
    # Tracked as usual outside it.
    holder.held = template
    assert len(holder.weights) == len(template.weights)
    assert "held" in holder._trackable_children()


def test_untracked_attributes_of_plain_objects_are_attributes():
    class Plain:
        pass

    plain = Plain()
    assert internals.set_untracked(plain, "_x", 3) == 3
    assert vars(plain) == {"_x": 3}


def test_metrics_in_order_is_what_train_on_batch_returns():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    x, y = keras.ops.ones((4, 8)), keras.ops.ones((4, 3))
    expected = model.test_on_batch(x, y)
    logs = model.test_on_batch(x, y, return_dict=True)
    assert internals.metrics_in_order(model, logs) == expected


def test_slurm_lists_are_expanded():
    assert tensorflow_internals.slurm_hostlist("n[1-2],m5") == ["n1", "n2", "m5"]
    assert tensorflow_internals.slurm_tasks_per_node("3(x2),1") == [3, 3, 1]
