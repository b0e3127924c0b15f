"""Is multi-device training right? `check_equivalence` trains and compares.

`check_equivalence(model, x, y, gpus, engine)` trains a compiled model for
a few steps on the same batches, in the same order, twice: on one device,
and through an engine (`"auto"`, `"replicate"` or `"mirrored"`, as
`multi_gpu_model` runs them, or `"strategy"`: Keras's own `fit` under
`mirrored_strategy()`; on JAX, `"auto"` or `"jax"`: the JAX engine). The
one-device reference is the model itself, not a copy: a copy that lost state (an adapted `Normalization`'s mean, a
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

This module checks the arguments and writes the report; the two runs are
`multigpu.insight.equivalence_runs`, the comparison and the causes
`multigpu.insight.differences`.
"""

import dataclasses
import math

import keras

from multigpu import backends
from multigpu import devices as devices_lib
from multigpu.arguments import check_int
from multigpu.engines import choice
from multigpu.engines.front import DEFAULT_ENGINE, resolve_sync_batchnorm
from multigpu.engines.functional import callable_graph
from multigpu.insight.differences import (
    as_written,
    batchnorm_positions,
    compare,
    copy_report,
    likely_cause,
)
from multigpu.insight.equivalence_runs import train_engine, train_reference
from multigpu.messages import api, literal, literals, setting

ENGINES = (*choice.engines_of("tensorflow"), "strategy",
           *choice.BACKEND_ENGINES["jax"])
DEFAULT_TOLERANCE = 1e-4


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
    sync_batchnorm = resolve_sync_batchnorm(sync_batchnorm)
    if engine == "strategy":
        backends.require_backend(
            "check_equivalence", backends.TF_DISTRIBUTE,
            written=f"{api('check_equivalence')} with "
                    f"{setting('engine', 'strategy')}")
    if sync_batchnorm and engine == "strategy":
        synchronized = as_written(
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
    ran = train_engine(model, x, y, size, devices, engine, sync_batchnorm)
    report = EquivalenceReport(
        equal=False, differences={}, tolerance=tolerance, engine=ran.name,
        devices=list(devices), steps=steps, batch_size=size,
        requested_engine=engine, engine_reason=ran.reason)
    if ran.mismatch is not None:
        return copy_report(report, model, ran)
    reference = train_reference(model, x, y, size, devices[0])
    compared = compare(reference, ran.trained, batchnorm_positions(model))
    report.differences = {name: difference
                          for name, (difference, _) in compared.items()}
    differing = [name for name, (difference, scale) in compared.items()
                 if not difference <= tolerance * max(1.0, scale)]
    report.equal = not differing
    if differing:
        report.first_difference = differing[0]
        report.cause = likely_cause(model, x, ran.name, devices, size,
                                    differing, sync_batchnorm)
    return report
