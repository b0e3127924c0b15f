"""Where two trainings of one model differ, and the likely cause.

`compare` measures the largest difference of every quantity
`check_equivalence` reports (the loss and metrics after every step, then
the weights, BatchNormalization's moving statistics and the optimizer's
state); `likely_cause` names what in the model explains the first that
differs, with the fix; `copy_report` fills a report whose engine's copy
of the model computes otherwise before any training.
"""

import math

import keras
import numpy as np

from multigpu.engines.copies import mismatch_text
from multigpu.messages import api, current_language, literal, literals, setting

# The quantity a report names when the engine's copy of the model computes
# otherwise before any training: nothing else can be compared then.
COPY = "copy"
BATCHNORM_STATISTICS = "batchnorm_statistics"
# The order in which quantities are compared and reported; metrics follow
# the loss, in the order Keras logs them.
_STATE_QUANTITIES = ("weights", BATCHNORM_STATISTICS, "optimizer_state")


def _layers(model):
    """Every layer of `model`, nested models' layers included."""
    found = []
    stack = list(getattr(model, "layers", []))
    while stack:
        layer = stack.pop(0)
        found.append(layer)
        stack.extend(getattr(layer, "layers", []))
    return found


def batchnorm_positions(model):
    """Positions in `model.weights` of BatchNormalization's moving statistics.

    Example:
    >>> batchnorm_positions(model)   # Dense, then BatchNormalization
    {4, 5}
    """
    statistics = {id(v) for layer in _layers(model)
                  if isinstance(layer, keras.layers.BatchNormalization)
                  for v in layer.non_trainable_weights}
    return {i for i, v in enumerate(model.weights) if id(v) in statistics}


def _largest(reference, other):
    """Largest absolute difference and largest absolute reference value."""
    difference, scale = 0.0, 0.0
    if len(reference) != len(other):
        return math.inf, 0.0
    for a, b in zip(reference, other):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            return math.inf, 0.0
        if a.size == 0:
            continue
        gap = np.abs(a - b)
        # NaN on one side only is as different as values get.
        gap = np.where(np.isnan(a) & np.isnan(b), 0.0, gap)
        gap = np.where(np.isnan(gap), np.inf, gap)
        difference = max(difference, float(gap.max()))
        finite = np.abs(a[np.isfinite(a)])
        if finite.size:
            scale = max(scale, float(finite.max()))
    return difference, scale


def compare(reference, other, batchnorm):
    """The largest difference of every quantity, in reporting order.

    Args:
        reference: What the one-device run `Trained`
            (`multigpu.insight.equivalence_runs`).
        other: What the engine's run trained.
        batchnorm: `batchnorm_positions` of the model.

    Returns:
        `{quantity: (largest absolute difference, largest absolute
        reference value)}`: the loss, the metrics, `"weights"`,
        `"batchnorm_statistics"` (with `batchnorm`) and
        `"optimizer_state"`.

    Example:
    >>> compare(reference, other, set())["weights"]
    (2.9e-08, 0.93)
    """
    compared = {}
    names = list(reference.logs[0]) if reference.logs else []
    for name in sorted(names, key=lambda n: n != "loss"):
        ours = [[step[name]] for step in reference.logs]
        theirs = [[step.get(name, math.nan)] for step in other.logs]
        compared[name] = _largest(ours, theirs)

    def split(weights, keep):
        return [w for i, w in enumerate(weights) if (i in batchnorm) == keep]

    compared["weights"] = _largest(split(reference.weights, False),
                                   split(other.weights, False))
    if batchnorm:
        compared[BATCHNORM_STATISTICS] = _largest(
            split(reference.weights, True), split(other.weights, True))
    compared["optimizer_state"] = _largest(reference.optimizer_state,
                                           other.optimizer_state)
    return compared


def as_written(python, r):
    """A Keras call as the user writes it: keras3's R function in R.

    Example:
    >>> as_written("keras.layers.Dense(1)", "layer_dense(units = 1)")
    'keras.layers.Dense(1)'
    """
    return r if current_language() == "r" else python


def _loss_name(loss):
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) \
        or type(loss).__name__


def _scalar_losses(model, loss, x):
    """The losses of `loss` that reduce the rows to one number themselves.

    Each is called on `model`'s predictions for two rows of `x`: Keras's
    losses return one value per row and reduce them after.
    """
    try:
        rows = keras.tree.map_structure(lambda a: a[:2], x)
        predictions = keras.tree.flatten(model(rows, training=False))
        losses = keras.tree.flatten(loss)
        if len(losses) != 1 or len(predictions) != 1:
            return []
        function = keras.losses.get(losses[0]) if isinstance(
            losses[0], str) else losses[0]
        call = function.call if isinstance(function, keras.losses.Loss) \
            else function
        target = keras.ops.zeros_like(predictions[0])
        values = call(target, predictions[0])
    except Exception:  # noqa: BLE001 - a cause is a hint, never an error
        return []
    return [function] if len(keras.ops.shape(values)) == 0 else []


def likely_cause(model, x, engine, devices, batch_size, differing,
                  sync_batchnorm=False):
    """Why the quantities `differing` differ, as far as the model tells.

    Args:
        model: The model checked.
        x: Its inputs.
        engine: The engine that ran.
        devices: The devices it ran on.
        batch_size: Rows per step.
        differing: The quantities that differ, in reporting order.
        sync_batchnorm: Whether the engine pooled BatchNormalization's
            statistics.

    Returns:
        The cause as a sentence, with the fix.

    Example:
    >>> likely_cause(model, x, "replicate", devices, 32, ["loss"])
    'BatchNormalization (...): its output depends on the rows it sees. ...'
    """
    replicas = len(devices)
    quantity = differing[0]
    if not set(differing) & {"loss", *_STATE_QUANTITIES}:
        return (
            f"only the metrics {literals(differing, 'and')} differ. The loss, "
            "the weights and the optimizer state agree, so the training "
            "steps are one device's; what differs is how the metric is "
            "totalled over the devices. A metric that is one statistic of "
            "the rows it is given (not a mean of one value per row) is "
            "computed on each device's rows: compute one value per row and "
            "let Keras average them.")
    scalar = [] if engine == "replicate" else _scalar_losses(
        model, model.loss, x)
    if scalar:
        return (
            f"the loss {literal(_loss_name(scalar[0]))} returns one number "
            "for all the rows it is given: it averages them "
            "itself. Under a strategy each of the "
            f"{replicas} devices computes it on its own rows, and the "
            f"devices' gradients are summed: {replicas} averages instead of "
            f"one, so the gradients (and the loss reported) are about "
            f"{replicas} times one device's. Keras divides a loss by the "
            "number of devices only when it reduces the rows itself. Fix: "
            "return one loss value per row (leave out the mean or sum over "
            "the batch) and let Keras reduce them "
            f"({setting('reduction', 'sum_over_batch_size')}, the default).")
    layers = _layers(model)
    batchnorm = [] if sync_batchnorm else [
        layer for layer in layers
        if isinstance(layer, keras.layers.BatchNormalization)
        and not (getattr(layer, "synchronized", False)
                 and engine != "replicate")]
    if batchnorm:
        names = literals([layer.name for layer in batchnorm[:3]], "and")
        synchronized = as_written(
            "keras.layers.BatchNormalization(synchronized=True)",
            "layer_batch_normalization(synchronized = TRUE)")
        fix = (f"{synchronized} with {setting('engine', 'strategy')} "
               "computes the statistics over the whole batch")
        if engine != "strategy":
            fix = (f"{setting('sync_batchnorm', True)} computes the "
                   "statistics over the whole batch")
        return (
            f"BatchNormalization ({names}): its output depends on the rows it "
            f"sees. Each device normalizes its own share (about "
            f"{batch_size // replicas} of the {batch_size} rows) with that "
            "share's mean and variance, and its moving statistics follow "
            "those per-device statistics, so the loss, the weights and the "
            "moving statistics drift from one device's; the fewer rows per "
            "device, the more. Check the batch size you train with "
            f"(`batch_size`); to remove the difference, {fix}.")
    random = [layer for layer in layers if hasattr(layer, "seed_generator")]
    if random:
        names = literals([layer.name for layer in random[:3]], "and")
        return (
            f"random layers ({names}) draw other random numbers on every "
            "device than on one, so the copies train on different masks or "
            "noise. Not an error; to compare the rest, check a copy of the "
            "model without them.")
    return (
        f"no layer or loss of this model explains it. Differences in "
        f"{quantity} beyond float rounding mean the engine's step is not "
        "one device's: a custom train_step, loss or layer that reads the "
        "batch size or the replica context; please report it with the "
        "model.")


def copy_report(report, model, ran):
    """The report of an engine whose copy of `model` computes otherwise.

    Args:
        report: The `EquivalenceReport` to fill.
        model: The model checked.
        ran: The `EngineRun` that holds the copy's mismatch.

    Returns:
        `report`, its difference `"copy"` and its cause filled in.
    """
    difference = ran.mismatch.difference
    report.differences = {COPY: difference.difference}
    report.first_difference = COPY
    fix = (f"Use {setting('engine', 'replicate')}, which trains the model "
           "itself" if ran.name != "strategy" else
           f"Build the model inside {api('mirrored_strategy')}'s scope "
           f"rather than copying it, or use {setting('engine', 'replicate')}")
    report.cause = (
        f"{setting('engine', ran.name)} trains a copy of the model, which "
        f"computes otherwise before any training: "
        f"{mismatch_text(model, difference)} {fix}; or give the layer a "
        "config (get_config) or saved state (save_own_variables) that "
        "holds that state.")
    return report
