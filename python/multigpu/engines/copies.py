"""An engine's copy of a model in memory: new variables, the same state.

The mirrored engine trains a copy of the template whose variables are
created under a strategy. It copies a model the user built in this
session, trusted code: the copy is not a load from a file and does not
fall under the rules Keras applies to untrusted files (`safe_mode`, which
refuses a `Lambda` layer's Python code). Loading a saved file keeps them.

A layer's config and variables are not all of its state: an adapted
`Normalization` keeps its mean and variance as constants made after
`adapt`, a lookup layer (`IntegerLookup`, `StringLookup`,
`TextVectorization`) keeps its vocabulary in a table. `copy_model` hands
that state over as Keras does when it loads a `.keras` file
(`carry_state`), and `check_copy` runs model and copy on a probe batch so
that state no hand-over reaches (an attribute set after construction) is
an error, not wrong numbers. `copy_in_scope` makes and checks the copy a
strategy trains.
"""

import collections
import contextlib
import math
import tempfile

import keras
import numpy as np

from multigpu import internals
from multigpu.engines.functional import (
    call_arguments,
    callable_graph,
    execution_order,
    symbolic_graph,
)
from multigpu.engines.template import built_like
from multigpu.messages import literal

# A copy agrees with its model when every output is within
# `PROBE_TOLERANCE * max(1, largest absolute output of the model)`: the two
# run the same operations on the same values, so only a kernel's choice of
# summation order separates them.
PROBE_TOLERANCE = 1e-3
# The length given to an input dimension other than the batch that the
# model leaves open (token ids of a KerasHub model: `(None, None)`).
PROBE_LENGTH = 8


def _copy_layer(layer):
    """The copy of one layer of a graph being copied (see `copy_model`)."""
    if isinstance(layer, keras.layers.Lambda):
        # No variables: the copy calls the same layer. Rebuilding it would
        # go through its serialized bytecode, which safe mode refuses and
        # which loses the globals the function reads (`ops` in
        # `lambda x: ops.square(x)`).
        return layer
    if isinstance(layer, keras.Model):
        return copy_model(layer)
    return layer.__class__.from_config(layer.get_config())


def copy_model(model):
    """A copy of `model` with new variables (initial values, not the weights).

    A model whose class has a config of its own (a KerasHub task or
    backbone, a subclassed model) is rebuilt from it, as
    `keras.models.clone_model` does, with its class: a KerasHub causal
    LM's token embedding, which is also its output projection, stays one
    layer. A Sequential or functional model is copied layer by layer
    through its graph, nested models by the same rule; a layer used twice
    stays one layer. `Lambda` layers are shared with `model`, not rebuilt:
    the copy runs the user's function itself, whatever globals it reads.

    Every layer's state then goes to its copy (`carry_state`): variables,
    and what Keras keeps outside them (an adapted `Normalization`'s
    constants, a lookup layer's vocabulary). State that neither Keras's
    hand-over nor the config holds (an attribute set after construction)
    is not carried: `check_copy` finds it.

    Create the copy under the scope (strategy, device) its variables
    belong to.

    Args:
        model: A built Keras model.

    Returns:
        A new, built Keras model with `model`'s weights and state.

    Raises:
        ValueError, TypeError, NotImplementedError: as
            `keras.models.clone_model` for a model that cannot be copied
            (a subclassed model without `get_config`: NotImplementedError);
            ValueError for a copy whose layers do not match `model`'s.

    Example:
    >>> with strategy.scope():
    ...     replica = copy_model(template)
    >>> check_copy(template, replica, invalid="Invalid `model` for ...",
    ...            fix="Use engine='replicate'.")
    """
    copy = _copy_structure(model)
    carry_state(model, copy)
    return copy


def copy_in_scope(model, strategy, invalid, fix, uncopyable_fix=None):
    """A checked copy of `model` whose variables `strategy` holds.

    The copy (`copy_model`) is made in `strategy`'s scope, under `model`'s
    dtype policy (`template.built_like`: its layers do not take a global
    policy set since), and checked on a probe batch (`check_copy`). The
    mirrored engine and `check_equivalence(engine="strategy")` train such
    copies.

    Args:
        model: A built Keras model.
        strategy: The `tf.distribute.Strategy` whose variables the copy's
            are.
        invalid: What the messages start with: the argument that is
            invalid, and for what (``"Invalid `model` for ..."``).
        fix: The sentence that ends the messages: what to do instead.
        uncopyable_fix: The sentence that ends the message for a model that
            cannot be copied at all, if other than `fix`.

    Returns:
        The copy, with `model`'s weights and state.

    Raises:
        ValueError: if `model` cannot be copied (a subclassed model without
            `get_config`, or whose config does not rebuild it).
        CopyMismatch: if the copy computes otherwise than `model`.

    Example:
    >>> replica = copy_in_scope(
    ...     template, strategy, "Invalid `model` for engine='mirrored'",
    ...     "Use engine='replicate', which needs no copy.")
    """
    with strategy.scope(), built_like(model):
        try:
            copy = copy_model(model)
        except (ValueError, TypeError, NotImplementedError) as error:
            # A subclassed model without `get_config` raises
            # NotImplementedError; one whose config does not rebuild it,
            # TypeError.
            raise ValueError(
                f"{invalid}: {literal(model.name)} cannot be cloned "
                f"({error}). {uncopyable_fix or fix}") from None
        check_copy(model, copy, invalid=invalid, fix=fix)
    return copy


def _copy_structure(model):
    """`model`'s layers and graph anew, with initial variables."""
    if _has_own_config(model) or not (
            isinstance(model, keras.Sequential) or _is_functional(model)):
        cls = type(model)
        custom_objects = {cls.__name__: cls,
                          keras.saving.get_registered_name(cls): cls}
        # The model is this session's own code: Lambda layers inside a
        # model rebuilt from its config are allowed, as loading a file
        # with `safe_mode=False` allows them.
        config = keras.saving.serialize_keras_object(model)
        # The copy is compiled by its engine, not from the model's config.
        config.pop("compile_config", None)
        return keras.saving.deserialize_keras_object(
            config, custom_objects=custom_objects, safe_mode=False)
    with _not_compiled(model):
        return keras.models.clone_model(model, clone_function=_copy_layer)


@contextlib.contextmanager
def _not_compiled(model):
    """`model` seen as not compiled, while `clone_model` copies it.

    `clone_model` compiles the copy from the model's compile config, which
    fails on a loss or metric function Keras cannot look up by name; the
    copy is compiled by its engine, not from that config (as the config
    path above drops it).
    """
    compiled = model.__dict__.get("compiled", False)
    model.__dict__["compiled"] = False
    try:
        yield
    finally:
        model.__dict__["compiled"] = compiled


def _layers_of(model):
    """Every layer of `model` at any depth, itself first, parents first.

    Keras's own order (`_flatten_layers`): the order in which a copy made
    from the same config or graph tracks its layers too.
    """
    return [model, *internals.nested_layers(model)]


def carry_state(model, copy):
    """Hands every layer's state in `model` to its counterpart in `copy`.

    Keras's own hand-over, in the order its `.keras` loader uses
    (`keras/src/saving/saving_lib.py`, `_load_state`): for each layer,
    parents before the layers they hold, `save_own_variables` into a dict
    and `load_own_variables` from it, then `save_assets` into a temporary
    directory and `load_assets` from it (a lookup layer's vocabulary). A
    layer whose variables were loaded then runs `finalize_state()`, as
    Keras's loader of weight files does: an adapted `Normalization` makes
    the mean and variance its `call` reads. Layers without variables do
    not: a `Discretization` copy would recompute its bin boundaries (taken
    from the config) from an empty summary.

    Args:
        model: The model copied.
        copy: Its copy (`copy_model`): the same layers, in the same order.

    Raises:
        ValueError: if the two do not have the same layers, or a layer's
            state does not fit its counterpart.
    """
    pairs = list(zip(_layers_of(model), _layers_of(copy)))
    if len(_layers_of(model)) != len(_layers_of(copy)) or any(
            type(ours) is not type(theirs) for ours, theirs in pairs):
        raise ValueError(
            f"its copy does not have the same layers as {literal(model.name)}"
            " (a model whose config does not rebuild the layers it holds)")
    for ours, theirs in pairs:
        # A layer shared with the copy (a `Lambda`) has its state already.
        if ours is not theirs:
            _carry_layer_state(ours, theirs)


def _carry_layer_state(ours, theirs):
    """One layer's variables, assets and finalized state, to its copy."""
    store = {}
    ours.save_own_variables(store)
    # Values, not the variables themselves: the copy's may live under a
    # strategy and must not read the model's on every step. NumPy arrays,
    # which every backend assigns (a JAX array on one device would keep
    # its placement into a copy laid out across several).
    store = {key: np.asarray(internals.stored_value(value))
             if isinstance(value, keras.Variable) else value
             for key, value in store.items()}
    try:
        theirs.load_own_variables(store)
    except ValueError as error:
        raise ValueError(
            f"the state of layer {literal(ours.name)} does not fit its copy "
            f"({' '.join(str(error).split())})") from None
    if hasattr(ours, "save_assets") and hasattr(theirs, "load_assets"):
        with tempfile.TemporaryDirectory() as directory:
            ours.save_assets(directory)
            theirs.load_assets(directory)
    if store and hasattr(theirs, "finalize_state"):
        theirs.finalize_state()


CopyDifference = collections.namedtuple(
    "CopyDifference", ["layer", "difference", "error"])
CopyDifference.__doc__ = """Where a copy first computes otherwise than its model.

`layer` is the first layer (or operation) whose output differs, or the
model when that cannot be told; `difference` the largest absolute
difference of its outputs (`inf` when the copy failed: `error`).
"""


class CopyMismatch(ValueError):
    """A copy of a model that does not compute what the model computes.

    Attributes:
        difference: The `CopyDifference` found by `check_copy`.
    """

    def __init__(self, message, difference):
        super().__init__(message)
        self.difference = difference


def check_copy(model, copy, invalid, fix):
    """Raises if `copy` does not give `model`'s outputs on a probe batch.

    Both run in inference mode on `probe_batch(model)`: ones and zeros,
    empty strings for string inputs. When they differ, the message names
    the first layer whose own output differs on the model's values (for a
    Sequential or functional model; the model otherwise).

    Args:
        model: The model copied.
        copy: Its copy, with `model`'s weights and state.
        invalid: What the message starts with: the argument that is
            invalid, and for what (``"Invalid `model` for ..."``).
        fix: The sentence that ends the message: what to do instead.

    Raises:
        CopyMismatch: a ValueError naming the layer, the difference and
            `fix`.

    Example:
    >>> check_copy(template, replica,
    ...            invalid="Invalid `model` for engine='mirrored'",
    ...            fix="Use engine='replicate', which needs no copy.")
    """
    difference = copy_difference(model, copy)
    if difference is not None:
        raise CopyMismatch(
            f"{invalid}: {mismatch_text(model, difference)} {fix}",
            difference)


def mismatch_text(model, difference):
    """What a `CopyDifference` means, in sentences, the fix left out.

    Args:
        model: The model copied.
        difference: Where its copy differs (`copy_difference`).

    Returns:
        The text `check_copy` raises, between its `invalid` and `fix`.
    """
    if difference.error is not None:
        what = (f"fails on a probe batch where {literal(model.name)} runs "
                f"({difference.error})")
    else:
        what = ("gives other outputs than the model on a probe batch in "
                f"inference (largest difference {difference.difference:.3g})")
    return (
        f"the copy of {literal(model.name)} {what}; "
        f"{difference.layer} computes otherwise in the copy. Its config "
        "and saved state (variables, assets) do not hold all of its state, "
        "e.g. an attribute set after the layer was made.")


def probe_batch(model):
    """Two rows for each of `model`'s inputs: ones, then zeros.

    Built from the input specs: the input's dtype (bool: True and False;
    strings: empty strings), its shape with the batch of 2 and other open
    dimensions of `PROBE_LENGTH` (token ids of a KerasHub model, 1 and 0,
    fit any vocabulary).

    Returns:
        The batch, in the structure of `model`'s inputs.
    """
    graph = callable_graph(model)
    return keras.tree.map_structure(_probe_for, graph.input)


def _probe_for(spec):
    shape = [2] + [PROBE_LENGTH if size is None else size
                   for size in tuple(spec.shape)[1:]]
    dtype = keras.backend.standardize_dtype(spec.dtype)
    if dtype == "string":
        return np.full(shape, "", dtype=object)
    rows = np.stack([np.ones(shape[1:]), np.zeros(shape[1:])])
    return rows.astype(dtype)


def copy_difference(model, copy):
    """Where `copy` first computes otherwise than `model`, or None.

    Args:
        model: A built model.
        copy: Its copy, with its weights and state.

    Returns:
        None when both give the same outputs on `probe_batch(model)` in
        inference (or nothing can be compared: `model` itself cannot run
        on the probe, or gives other outputs each time, as a layer that
        draws random numbers in inference does), else a `CopyDifference`.
    """
    probe = probe_batch(model)
    try:
        expected = model(probe, training=False)
        again = model(probe, training=False)
    except Exception:  # noqa: BLE001 - the probe is ours, not the user's
        return None
    if _largest_gap(expected, again) is not None:
        return None
    difference, error = _outputs_difference(
        expected, copy, (probe,), {"training": False})
    if difference is None:
        return None
    place = _first_differing_layer(model, copy, probe)
    if place is None:
        return CopyDifference(f"the model {literal(model.name)}",
                              difference, error)
    return place


def _outputs_difference(expected, operation, args, kwargs):
    """`(largest difference, error)` of `operation(*args, **kwargs)`.

    From `expected`; `(None, None)` when they agree within
    `PROBE_TOLERANCE`.
    """
    try:
        got = operation(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - a failing copy is a finding
        return math.inf, " ".join(str(error).split())[:300]
    gap = _largest_gap(expected, got)
    return (None, None) if gap is None else (gap, None)


def _largest_gap(expected, got):
    """The largest absolute difference when beyond tolerance, else None.

    Strings (an inverted lookup's output) either all match or differ by
    `inf`; sparse or ragged values are not compared.
    """
    expected, got = keras.tree.flatten(expected), keras.tree.flatten(got)
    if len(expected) != len(got):
        return math.inf
    largest, scale = 0.0, 0.0
    for a, b in zip(expected, got):
        a, b = _array(a), _array(b)
        if a is None or b is None:
            continue
        if a.shape != b.shape:
            return math.inf
        if a.dtype.kind in "OSU" or b.dtype.kind in "OSU":
            largest = max(largest, 0.0 if np.array_equal(a, b) else math.inf)
            continue
        if a.size == 0:
            continue
        a, b = a.astype(np.float64), b.astype(np.float64)
        gap = np.abs(a - b)
        # NaN on both sides (a fully masked row of zeros) agrees.
        gap = np.where(np.isnan(a) & np.isnan(b), 0.0, gap)
        largest = max(largest, float(np.nan_to_num(gap, nan=np.inf).max()))
        finite = np.abs(a[np.isfinite(a)])
        scale = max(scale, float(finite.max()) if finite.size else 0.0)
    return largest if largest > PROBE_TOLERANCE * max(1.0, scale) else None


def _array(value):
    """`value` as a NumPy array, or None (sparse or ragged)."""
    try:
        return np.asarray(keras.ops.convert_to_numpy(value))
    except Exception:  # noqa: BLE001 - sparse or ragged values are skipped
        return None


def _first_differing_layer(model, copy, probe):
    """The first layer of a graph whose output differs, or None.

    Walks `model`'s graph in execution order on `probe`, running each
    operation of `model` and its counterpart in `copy` on the same
    values (the model's): the first one whose outputs differ is where the
    copy's state is wrong, not merely downstream of it. A nested model
    that differs is searched in turn. None for a model that is no graph.
    """
    try:
        ours, theirs = symbolic_graph(model), symbolic_graph(copy)
    except (TypeError, ValueError):
        return None
    our_nodes, their_nodes = execution_order(ours), execution_order(theirs)
    if len(our_nodes) != len(their_nodes) or any(
            type(a.operation) is not type(b.operation)
            for a, b in zip(our_nodes, their_nodes)):
        return None
    values = {id(t): v for t, v in zip(
        keras.tree.flatten(ours.input), keras.tree.flatten(probe))}
    for node, counterpart in zip(our_nodes, their_nodes):
        args, kwargs = call_arguments(node, values, False)
        outputs = node.operation(*args, **kwargs)
        if node.operation is not counterpart.operation:
            gap, error = _outputs_difference(
                outputs, counterpart.operation, args, kwargs)
            if gap is not None:
                return _inside(node.operation, counterpart.operation,
                               args, kwargs) or CopyDifference(
                    _describe(node.operation), gap, error)
        values.update((id(t), v) for t, v in zip(
            node.outputs, keras.tree.flatten(outputs)))
    return None


def _inside(ours, theirs, args, kwargs):
    """The differing layer inside a nested model called on one input."""
    if not isinstance(ours, keras.Model) or len(args) != 1:
        return None
    if set(kwargs) - {"training", "mask"}:
        return None
    return _first_differing_layer(ours, theirs, args[0])


def _describe(operation):
    return f"layer {literal(operation.name)} ({type(operation).__name__})"


def _has_own_config(model):
    """Whether `model`'s class defines `get_config` (Keras's own do not)."""
    module = getattr(type(model).get_config, "__module__", None) or ""
    return not module.startswith("keras.")


def _is_functional(model):
    """Whether `model` is Keras's functional model or a subclass of it."""
    return internals.is_functional(model)
