"""Is multi-device training right? `check_equivalence` trains and compares.

`check_equivalence(model, x, y, gpus, engine)` trains a compiled model for
a few steps on the same batches, in the same order, twice: on one device,
and through an engine (`"auto"`, `"replicate"` or `"mirrored"`, as
`multi_gpu_model` runs them, or `"strategy"`: Keras's own `fit` under
`mirrored_strategy()`; on JAX, `"auto"` or `"jax"`: the JAX engine). The one-device reference is the model itself, not
a copy: a copy that lost state (an adapted `Normalization`'s mean, a
lookup's vocabulary) would agree with an engine that trains the same
lossy copy. Both runs start from the model's weights, with a fresh
optimizer of the model's config and the same loss and metrics; the
model's weights, optimizer and compile state are put back afterwards. The
report says whether the two agree, quantity by quantity, and names the
first one that differs with its likely cause: a copy the engine made that
computes otherwise, a layer whose output depends on the rows it sees
(BatchNormalization normalizes each device's share with that share's
statistics), random layers, or a loss summed over the rows instead of
averaged under a strategy.
"""

import contextlib
import dataclasses
import math

import keras
import numpy as np

from multigpu import backends, internals, runtime
from multigpu import devices as devices_lib
from multigpu.arguments import check_flag, check_int
from multigpu.engines import choice
from multigpu.engines.compiled import compile_arguments
from multigpu.engines.copies import CopyMismatch, copy_in_scope, mismatch_text
from multigpu.engines.front import DEFAULT_ENGINE, multi_gpu_model
from multigpu.engines.functional import callable_graph
from multigpu.messages import api, current_language, literal, literals, setting

ENGINES = (*choice.engines_of("tensorflow"), "strategy",
           *choice.BACKEND_ENGINES["jax"])
# The quantity a report names when the engine's copy of the model computes
# otherwise before any training: nothing else can be compared then.
COPY = "copy"
DEFAULT_TOLERANCE = 1e-4
BATCHNORM_STATISTICS = "batchnorm_statistics"
# The order in which quantities are compared and reported; metrics follow
# the loss, in the order Keras logs them.
_STATE_QUANTITIES = ("weights", BATCHNORM_STATISTICS, "optimizer_state")


@dataclasses.dataclass
class EquivalenceReport:
    """What `check_equivalence` found: does training through an engine agree?

    Attributes:
        equal: Whether every quantity agrees within the tolerance.
        differences: Quantity -> largest absolute difference between the
            engine's copy and the one-device reference: `"loss"`, each
            metric Keras logs, `"weights"` (every weight but the
            BatchNormalization statistics), `"batchnorm_statistics"` (moving
            means and variances; only for models with BatchNormalization)
            and `"optimizer_state"` (the optimizer's variables). Loss and
            metrics are compared after every step, the rest after the last.
            When the engine's copy of the model computes otherwise before
            any training, only `"copy"`: the largest difference of its
            outputs (`inf` when it fails).
        tolerance: A quantity agrees when its largest difference is at most
            `tolerance * max(1, largest absolute reference value)`.
        engine: The engine that ran: `"replicate"`, `"mirrored"` or
            `"strategy"` (with `engine="auto"`, the one it chose).
        devices: The devices the engine trained on.
        steps: Training steps compared.
        batch_size: Rows of each step's batch (the global batch).
        first_difference: The first quantity (in the order of
            `differences`) that does not agree, or None.
        cause: The likely cause of that difference, with the fix, or None.
        requested_engine: The `engine` argument: `"auto"` or the engine.
        engine_reason: Why `engine` ran (`multi_gpu_model`'s
            `engine_reason`; with `"auto"`, its choice and any fallback).
    """

    equal: bool
    differences: dict
    tolerance: float
    engine: str
    devices: list
    steps: int
    batch_size: int
    first_difference: str = None
    cause: str = None
    requested_engine: str = None
    engine_reason: str = None

    def __str__(self):
        if self.requested_engine in (None, self.engine):
            against = setting("engine", self.engine)
        else:
            against = (f"{setting('engine', self.requested_engine)} (the "
                       f"{self.engine} engine)")
        head = (f"{self.steps} training steps of {self.batch_size} rows, "
                f"one device against {against} on "
                f"{len(self.devices)} devices: ")
        if self.equal:
            head += f"equal within {setting('tolerance', self.tolerance)}."
        else:
            head += (f"{self.first_difference} differs first (largest "
                     f"difference {_number(self.differences[self.first_difference])}).")
        width = max(len(name) for name in self.differences)
        rows = [f"  {name:<{width}}  {_number(value)}"
                for name, value in self.differences.items()]
        lines = [head, "Largest absolute differences:", *rows]
        if self.requested_engine not in (None, self.engine):
            lines.append(f"Engine: {self.engine}, {self.engine_reason}.")
        if self.cause:
            lines.append(f"Likely cause: {self.cause}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))


def _number(value):
    return "inf" if math.isinf(value) else f"{value:.3g}"


def _check_engine(engine):
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(
            f"Invalid `engine`: received {literal(engine)}; expected one of "
            f"{literals(list(ENGINES))}: {literal('auto')} (the default), "
            f"{literal('replicate')} and {literal('mirrored')} are the "
            f"engines of {api('multi_gpu_model')} on TensorFlow, "
            f"{literal('jax')} its engine on JAX, {literal('strategy')} is "
            f"Keras's fit under {api('mirrored_strategy')}.")
    return engine


def _check_tolerance(tolerance):
    if (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
            or not math.isfinite(tolerance) or tolerance < 0):
        raise ValueError(
            f"Invalid `tolerance`: received {literal(tolerance)}; expected a "
            f"number >= 0, e.g. {literal(DEFAULT_TOLERANCE)}.")
    return float(tolerance)


def _check_model(model):
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `model`: received an object of type "
            f"{type(model).__name__}; expected a compiled Keras model.")
    if getattr(model, "template", None) is not None:
        raise ValueError(
            f"Invalid `model`: {literal(model.name)} already runs on several "
            "devices; pass the model it was built from (its `template`), "
            "compiled.")
    if not model.compiled or getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"Invalid `model`: {literal(model.name)} is not compiled. Compile "
            "it with the optimizer, loss and metrics you train with: they "
            "are what is compared.")
    callable_graph(model)


def _rows(x, name):
    leaves = keras.tree.flatten(x)
    if not leaves or any(not hasattr(leaf, "shape") or len(leaf.shape) == 0
                         for leaf in leaves):
        raise TypeError(
            f"Invalid `{name}`: expected arrays (or a list or dict of "
            "arrays) with one row per sample, not a dataset or generator: "
            "the batches must be the same for both copies.")
    return int(leaves[0].shape[0])


def _batch_size(batch_size, rows, steps, replicas, engine):
    """The global batch: given, or the most rows `steps` batches can have."""
    if batch_size is None:
        size = rows // steps // replicas * replicas
        if size < replicas:
            raise ValueError(
                f"Invalid `x`: {rows} rows are too few for {steps} steps on "
                f"{replicas} devices (at least one row per device and step, "
                f"{steps * replicas} rows). Pass more rows or fewer `steps`.")
        return size
    size = check_int("batch_size", batch_size, replicas,
                     f"an int >= {replicas} (one row per device at least)")
    if size * steps > rows:
        raise ValueError(
            f"Invalid `batch_size`: received {literal(size)}, but {steps} "
            f"steps need {size * steps} rows and `x` has {rows}. Pass a "
            f"`batch_size` of at most {rows // steps}, or fewer `steps`.")
    if engine == "strategy" and size % replicas:
        raise ValueError(
            f"Invalid `batch_size`: received {literal(size)} with "
            f"{setting('engine', 'strategy')}; Keras's fit under a strategy "
            f"needs a multiple of the {replicas} devices, e.g. "
            f"{literal(size // replicas * replicas or replicas)}.")
    return size


def _strategy_copy(model, strategy):
    """`model` copied under `strategy`'s scope, with its weights and state.

    Keras's `fit` under a strategy needs variables made in its scope: the
    copy is the mirrored engine's (`multigpu.engines.copies.copy_in_scope`).

    Raises:
        CopyMismatch: if the copy computes otherwise than `model`.
        ValueError: if `model` cannot be copied, or has a layer written in
            R (`mirrored.check_no_r_code`).
    """
    from multigpu.engines.tensorflow.mirrored import check_no_r_code

    invalid = f"Invalid `model` for {setting('engine', 'strategy')}"
    check_no_r_code(model, invalid)
    return copy_in_scope(
        model, strategy, invalid,
        fix=(f"Build the model inside {api('mirrored_strategy')}'s scope "
             f"rather than copying it, or use {setting('engine', 'replicate')}."),
        uncopyable_fix=("A subclassed model needs `get_config` and "
                        "`from_config` that rebuild it."))


def _stored(variable):
    """A variable's value as stored, as a NumPy array."""
    return np.array(internals.stored_value(variable))


def _on_device(device):
    """A block whose new arrays and steps run on `device` alone."""
    return runtime.of_backend().device_scope(device)


@contextlib.contextmanager
def _put_back(model):
    """Leaves `model` as it was: variables, optimizer, compile state.

    The block may compile and train `model` (the one-device reference, the
    replicate engine's template, the mirrored engine's template compiled
    alongside it). Afterwards every variable of the model and of its
    optimizer holds its value from before, and its attributes (optimizer,
    loss, metrics, compiled functions, the lists Keras tracks them in) are
    the same objects as before: a later `fit` continues the user's
    training.
    """
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables) + list(
        getattr(optimizer, "variables", None) or [])
    values = [_stored(v) for v in variables]
    attributes = dict(model.__dict__)
    # Keras tracks metrics, layers and variables in lists and dicts it
    # keeps as attributes; compiling again appends to them in place.
    # (`type`, not `isinstance`: TensorFlow's tracking proxies pass for
    # dicts without being ones.)
    contents = {key: (list(value) if issubclass(type(value), list)
                      else dict(value))
                for key, value in attributes.items()
                if issubclass(type(value), (list, dict))}
    try:
        yield
    finally:
        model.__dict__.clear()
        model.__dict__.update(attributes)
        for key, saved in contents.items():
            container = attributes[key]
            # The containers' own methods would track the items again.
            if isinstance(container, list):
                list.__setitem__(container, slice(None), saved)
            else:
                dict.clear(container)
                dict.update(container, saved)
        for variable, value in zip(variables, values):
            variable.assign(value)


class _StepLogs(keras.callbacks.Callback):
    """Keeps the logs of every training step."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append({key: float(value)
                           for key, value in (logs or {}).items()})


def _train(model, x, y, batch_size):
    logs = _StepLogs()
    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False,
              verbose=0, callbacks=[logs])
    return logs.steps


@dataclasses.dataclass
class _Trained:
    logs: list
    weights: list
    optimizer_state: list


def _optimizer_state(optimizer):
    return [np.asarray(keras.ops.convert_to_numpy(v))
            for v in optimizer.variables]


def _train_reference(model, x, y, batch_size, device):
    """`model` itself trained on `device`, then put back (`_put_back`)."""
    with _put_back(model), _on_device(device):
        model.compile(**compile_arguments(model))
        logs = _train(model, x, y, batch_size)
        return _Trained(logs, model.get_weights(),
                        _optimizer_state(model.optimizer))


@dataclasses.dataclass
class _Engine:
    """What trained through an engine: its name, why, and the result."""

    name: str
    reason: str
    trained: _Trained = None
    mismatch: CopyMismatch = None


def _train_engine(model, x, y, batch_size, devices, engine,
                  sync_batchnorm=False):
    """`model` trained through `engine` (put back after), or its mismatch.

    A copy the engine makes that computes otherwise (`CopyMismatch`) is a
    finding, not an error: the `_Engine` holds it and nothing is trained.
    """
    if engine == "strategy":
        from multigpu.distribute import strategy as strategy_lib

        reason = f"Keras's own fit under {api('mirrored_strategy')}"
        strategy = strategy_lib.strategy_over(devices)
        try:
            copy = _strategy_copy(model, strategy)
        except CopyMismatch as mismatch:
            return _Engine(engine, reason, mismatch=mismatch)
        # The optimizer is made in the scope: its step count is mirrored.
        with strategy.scope():
            copy.compile(**compile_arguments(model))
        logs = _train(copy, x, y, batch_size)
        return _Engine(engine, reason, _Trained(
            logs, copy.get_weights(), _optimizer_state(copy.optimizer)))
    with _put_back(model):
        try:
            parallel = multi_gpu_model(model, gpus=list(devices),
                                       engine=engine,
                                       sync_batchnorm=sync_batchnorm)
        except CopyMismatch as mismatch:
            return _Engine(engine, f"requested with {setting('engine', engine)}",
                           mismatch=mismatch)
        parallel.compile(**compile_arguments(model))
        logs = _train(parallel, x, y, batch_size)
        return _Engine(parallel.engine, parallel.engine_reason, _Trained(
            logs, model.get_weights(), _optimizer_state(parallel.optimizer)))


def _layers(model):
    """Every layer of `model`, nested models' layers included."""
    found = []
    stack = list(getattr(model, "layers", []))
    while stack:
        layer = stack.pop(0)
        found.append(layer)
        stack.extend(getattr(layer, "layers", []))
    return found


def _batchnorm_positions(model):
    """Positions in `model.weights` of BatchNormalization's moving statistics."""
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


def _compare(reference, other, batchnorm):
    """`{quantity: (difference, scale)}` in reporting order."""
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


def _keras(python, r):
    """A Keras call as the user writes it: keras3's R function in R."""
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


def _likely_cause(model, x, engine, devices, batch_size, differing,
                  sync_batchnorm=False):
    """Why the quantities `differing` differ, as far as the model tells."""
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
        synchronized = _keras(
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


def check_equivalence(model, x, y, gpus=None, engine=DEFAULT_ENGINE, steps=3,
                      batch_size=None, tolerance=DEFAULT_TOLERANCE,
                      sync_batchnorm=None):
    """Trains a model on one device and through an engine; compares.

    Both runs start from `model`'s weights, get an optimizer of
    `model.optimizer`'s class and config (fresh state), `model`'s loss and
    metrics, and train for `steps` steps on the same batches in the same
    order (the first `steps * batch_size` rows of `x`, not shuffled). The
    reference is `model` itself, trained on the first device; the other
    run goes through `engine`: `"auto"`, `"replicate"` or `"mirrored"`
    (`multi_gpu_model(model, gpus, engine)`; the mirrored engine trains
    a copy), or `"strategy"` (a copy made under `mirrored_strategy(gpus)`'s
    scope, trained by Keras's own `fit`). A copy that computes otherwise
    than `model` before any training (a layer whose state its config and
    saved state do not hold) is reported as the difference `"copy"`.
    Afterwards `model` is as it was: its weights, its optimizer and its
    state, its compiled loss and metrics.

    Args:
        model: A compiled Keras model (Sequential, functional or
            subclassed; the mirrored engine and `"strategy"` copy it, which
            needs `get_config`), the template, not a model
            `multi_gpu_model` returned.
        x: Inputs: an array, or a list or dict of arrays, with at least
            `steps * batch_size` rows.
        y: Targets for `x`.
        gpus: The devices, as for `multi_gpu_model`: `None` (every GPU, or
            every logical CPU device), an int >= 2, ids or device names.
        engine: `"auto"` (the default: the engine `multi_gpu_model` runs
            by default on these devices, `report.engine` says which),
            `"replicate"`, `"mirrored"` or `"strategy"` on TensorFlow;
            `"auto"` or `"jax"` on JAX.
        steps: Training steps to compare, an int >= 1.
        batch_size: Rows per step (the global batch); `None` takes the
            largest multiple of the device count that leaves `steps`
            batches in `x`. With `"strategy"`, a multiple of the devices.
        tolerance: Relative tolerance, a number >= 0; a quantity agrees
            when its largest absolute difference is at most
            `tolerance * max(1, largest absolute reference value)`.
        sync_batchnorm: Build the engine's model with
            `multi_gpu_model(..., sync_batchnorm=True)`: BatchNormalization
            statistics over the whole batch, so a BatchNormalization model
            is checked against one device too. Not with `"strategy"`.
            `None` (the default): `False` on TensorFlow; `True` on JAX,
            where XLA's split pools the statistics over the whole batch.

    Returns:
        An `EquivalenceReport`: `equal`, `differences` (quantity -> largest
        absolute difference), `tolerance`, `first_difference`, `cause`,
        `engine` (the engine that ran) and `engine_reason`; printing it
        names the engine, the first quantity that differs and its likely
        cause.

    Raises:
        ValueError: for an unknown engine, invalid `gpus`, `steps`,
            `batch_size`, `tolerance` or `sync_batchnorm`, too few rows, or
            a model that is not compiled or cannot be copied.
        UnsupportedBackendError: for `engine="strategy"` on a backend other
            than TensorFlow (`multigpu.backends.require_backend`).
        TypeError: if `model` is not a Keras model, or `x` or `y` are not
            arrays.

    Example:
    >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
    ...               metrics=["accuracy"])
    >>> report = multigpu.check_equivalence(model, x, y, gpus=4)
    >>> report.equal, report.engine
    (True, 'replicate')
    >>> print(report)   # the largest difference of every quantity
    """
    _check_model(model)
    engine = _check_engine(engine)
    steps = check_int("steps", steps, 1)
    tolerance = _check_tolerance(tolerance)
    sync_batchnorm = _check_sync_batchnorm(sync_batchnorm)
    if engine == "strategy":
        backends.require_backend(
            "check_equivalence", backends.TF_DISTRIBUTE,
            written=f"{api('check_equivalence')} with "
                    f"{setting('engine', 'strategy')}")
    if sync_batchnorm and engine == "strategy":
        synchronized = _keras(
            "keras.layers.BatchNormalization(synchronized=True)",
            "layer_batch_normalization(synchronized = TRUE)")
        raise ValueError(
            f"Invalid `sync_batchnorm`: {setting('sync_batchnorm', True)} is "
            f"an option of {api('multi_gpu_model')}'s engines, not of "
            f"{setting('engine', 'strategy')} (Keras's own `fit` under a "
            f"strategy). Use {setting('engine', 'replicate')} or "
            f"{literal('mirrored')}, or build the model with {synchronized}.")
    devices = devices_lib.resolve_devices(gpus)
    rows = _rows(x, "x")
    if _rows(y, "y") != rows:
        raise ValueError(
            f"Invalid `y`: it has {_rows(y, 'y')} rows and `x` has {rows}; "
            "pass one target row per input row.")
    size = _batch_size(batch_size, rows, steps, len(devices), engine)

    def first(data):
        return keras.tree.map_structure(lambda a: a[:steps * size], data)

    x, y = first(x), first(y)
    ran = _train_engine(model, x, y, size, devices, engine, sync_batchnorm)
    report = EquivalenceReport(
        equal=False, differences={}, tolerance=tolerance, engine=ran.name,
        devices=list(devices), steps=steps, batch_size=size,
        requested_engine=engine, engine_reason=ran.reason)
    if ran.mismatch is not None:
        return _copy_report(report, model, ran)
    reference = _train_reference(model, x, y, size, devices[0])
    compared = _compare(reference, ran.trained, _batchnorm_positions(model))
    report.differences = {name: difference
                          for name, (difference, _) in compared.items()}
    differing = [name for name, (difference, scale) in compared.items()
                 if not difference <= tolerance * max(1.0, scale)]
    report.equal = not differing
    if differing:
        report.first_difference = differing[0]
        report.cause = _likely_cause(model, x, ran.name, devices, size,
                                     differing, sync_batchnorm)
    return report


def _check_sync_batchnorm(value):
    """`sync_batchnorm` checked; None: the backend's engines' default.

    The TensorFlow engines default to False; on JAX, XLA's split pools
    BatchNormalization's statistics over the whole batch: True.
    """
    if backends.is_jax():
        return True if value is None else check_flag("sync_batchnorm", value)
    from multigpu.engines.tensorflow.sync_batchnorm import check_sync_batchnorm

    return check_sync_batchnorm(False if value is None else value)


def _copy_report(report, model, ran):
    """The report of an engine whose copy of `model` computes otherwise."""
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
