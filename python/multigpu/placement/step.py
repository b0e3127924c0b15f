"""One observed step: which step runs, and the model left as it was after it.

A report runs a prediction or training step on fresh step functions (so that
TensorFlow exports their graphs), records its tensors' sizes, partition
graphs and profile, and restores weights, optimizer and metric state.
"""


from multigpu.devices import HOST_DEVICE
from multigpu.messages import setting
from multigpu.placement import communication, profiler
from multigpu.placement.arguments import check_report_args, check_trainable
from multigpu.placement.graphs import (
    ExecutedNode,
    executed_node_defs,
    variables_by_device,
)
from multigpu.variables import variable_bytes


def state_variables(model):
    """Every variable a step may change: weights, metrics, optimizer, template."""
    optimizer = getattr(model, "optimizer", None)
    state = list(model.variables) + list(getattr(model, "metrics_variables", []))
    if optimizer is not None:
        state += list(optimizer.variables)
    # The template of a mirrored-engine model, which its steps copy into.
    template = getattr(model, "template", None)
    if template is not None:
        state += list(template.variables)
    return list({id(v): v for v in state}.values())


def step_runner(model, x, y):
    """A function running one step on (x, y), and its kind.

    A training step is `train_on_batch`. Under a `tf.distribute` strategy
    (a strategy-built model, the mirrored engine) Keras 3 hands every
    replica the whole batch there, where `fit` gives each replica its rows;
    the report shows what `train_on_batch` moved.
    """
    if y is None:
        return (lambda: model.predict_on_batch(x)), "predict", "predict_function"
    check_trainable(model)
    if not model.optimizer.built:
        # Built now (in the model's strategy) so that its state is restored.
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)
    return (lambda: model.train_on_batch(x, y)), "train", "train_function"


class Restored:
    """Runs steps, then puts weights, optimizer and metric state back."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.variables = state_variables(self.model)
        self.values = [v.numpy() for v in self.variables]
        return self

    def __exit__(self, *exc):
        for variable, value in zip(self.variables, self.values):
            variable.assign(value)
        return False


def fresh_function(model, attribute):
    """Forgets the model's compiled step so the next step re-instantiates."""
    previous = getattr(model, attribute, None)
    setattr(model, attribute, None)
    return previous


def sizes_and_node_defs(model, run, attribute):
    """The tensor sizes and the executed node defs of one step.

    The sizes come from an instrumented step function (the debugger adds
    ops), so the node defs are taken from a fresh one. The caller restores
    the model's own function afterwards.

    Args:
        model: The model whose step `run` runs.
        run: A callable running one step.
        attribute: The model's attribute holding the step function.

    Returns:
        `(sizes, node_defs)`.
    """
    sizes = communication.recorded_tensor_sizes(run)
    fresh_function(model, attribute)
    _, node_defs = executed_node_defs(run)
    return sizes, node_defs


def observe_step(model, x, y):
    """One step observed: its partition graphs, tensor sizes, op times.

    Three fresh step functions would be one too many: the sizes come from
    an instrumented function (the debugger adds ops), which is dropped;
    the partition graphs and the profile come from one clean function.
    """
    run, kind, attribute = step_runner(model, x, y)
    with Restored(model):
        previous = fresh_function(model, attribute)
        try:
            sizes, node_defs = sizes_and_node_defs(model, run, attribute)
            run()  # warm-up outside run metadata, for the timed step
            nodes = [ExecutedNode(device, node.op, node.name)
                     for device, node in node_defs]
            times, time_note = profiler.trace_op_times(run)
        finally:
            setattr(model, attribute, previous)
    if not node_defs:
        raise RuntimeError(
            "TensorFlow exported no executed graph for this step: is the "
            f"model running eagerly ({setting('run_eagerly', True)})? Placement is observed "
            "on compiled steps only."
        )
    return kind, node_defs, nodes, sizes, times, time_note


def model_transfers(model, node_defs, sizes, variables):
    """The step's transfers, classified with the model's weights."""
    optimizer = getattr(model, "optimizer", None)
    return communication.step_transfers(
        node_defs, sizes,
        gradient_sizes={variable_bytes(v) for v in model.trainable_weights},
        weight_devices=[d for d, (count, _) in variables.items() if count],
        optimizer_scopes=[optimizer.name] if optimizer is not None else [],
        host=HOST_DEVICE,
    )


def step_traffic(model, x, y=None):
    """The transfers of one step, without the rest of the report.

    Runs the step twice (sized, observed) on fresh step functions and
    restores the model's state, like `placement_report`, without profiling.

    Args:
        model: A Keras model (compiled when `y` is given).
        x: Inputs of one batch.
        y: Targets of that batch for a training step, or None for a
            prediction step.

    Returns:
        A list of `multigpu.placement.traffic.Transfer`.

    Raises:
        TypeError, ValueError, RuntimeError: as `placement_report`.

    Example:
    >>> transfers = step_traffic(parallel, x[:64], y[:64])
    >>> traffic.bytes_by_kind(transfers)["weights"]
    3276800
    """
    check_report_args(model, x, y, True)
    if x is None:
        raise ValueError(
            "Invalid `x`: received None; a step needs one batch of inputs.")
    run, _, attribute = step_runner(model, x, y)
    with Restored(model):
        previous = fresh_function(model, attribute)
        try:
            sizes, node_defs = sizes_and_node_defs(model, run, attribute)
        finally:
            setattr(model, attribute, previous)
    return model_transfers(model, node_defs, sizes,
                            variables_by_device(model))
