"""A model's `fit`, `evaluate` and `predict`, run with their arguments checked.

`checked_call` is the hook of the engines' models (`TemplateBacked`): it
binds the call's arguments by name (`bound_arguments`), checks them
(`check_data`, `check_batch_size`, the class weights) before Keras runs,
and after it refuses a dataset of unknown size that yielded no batch
(`no_batch_error`).
"""

import inspect

import keras

from multigpu import internals
from multigpu.arguments import check_int
from multigpu.inputs.data import (
    check_batched,
    check_dense,
    check_numeric_x,
    check_numeric_y,
    check_rows,
    has_unknown_size,
    is_dataset,
)
from multigpu.inputs.labels import (
    check_class_weight,
    check_labels,
    check_sample_weight,
)
from multigpu.messages import literal, setting

_VERB = {"fit": "train on", "evaluate": "evaluate", "predict": "predict",
         "validation": "validate on"}


def bound_arguments(method, model, args=(), kwargs=None, defaults=False):
    """The arguments of `keras.Model.<method>(model, *args, **kwargs)` by name.

    Keras's signature of the method binds them: positional arguments get
    their parameter's name, and the method's `**kwargs` are merged in.

    Args:
        method: The name of a `keras.Model` method: `"fit"`, `"compile"`,
            `"evaluate"`, ...
        model: The model the method is called on (bound as `self`, which
            the result leaves out).
        args: The positional arguments of the call.
        kwargs: Its keyword arguments.
        defaults: Also give the parameters the call leaves out, with their
            defaults.

    Returns:
        A new dict of argument names to values.

    Raises:
        TypeError: if the arguments do not fit Keras's signature (callers
            that leave the call to Keras report nothing themselves).

    Example:
    >>> bound_arguments("fit", model, (x, y, 32))["batch_size"]
    32
    """
    bound = inspect.signature(getattr(keras.Model, method)).bind(
        model, *args, **(kwargs or {}))
    if defaults:
        bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop("self")
    arguments.update(arguments.pop("kwargs", None) or {})
    return arguments


def _bound(method, model, args, kwargs):
    """The arguments of `model.<method>(*args, **kwargs)` by name, or None.

    None when they do not fit Keras's signature: Keras reports that itself.
    """
    try:
        return bound_arguments(method, model, args, kwargs, defaults=True)
    except TypeError:
        return None


def no_batch_error(name, method):
    """The error for a dataset (of unknown size) that yielded no batch."""
    return ValueError(
        f"Invalid `{name}`: the dataset yielded no batch, so "
        f"{'fit' if method == 'validation' else method}() had nothing to "
        f"{_VERB[method]}; expected at least one batch. Check the dataset's "
        f"size and its filters, and {setting('drop_remainder', True)} with "
        "fewer rows than one batch.")


def check_batch_size(value, name="batch_size"):
    """`value` as None or an int >= 1 (Keras reads 0 as its default, 32)."""
    if value is None:
        return None
    return check_int(name, value, 1, expected=(
        f"{literal(None)} (Keras's default, 32 rows) or an int >= 1 (rows "
        "per step, split between the devices)"))


def check_data(model, method, x, y=None, sample_weight=None, name=None):
    """The checks of one set of data, before Keras sees it.

    Args:
        model: The model the data is for.
        method: As for `check_rows`.
        x, y, sample_weight: The data, as `fit` takes it.
        name: One name for all three in messages (`"validation_data"`), or
            None for their own names.
    """
    names = (name,) * 3 if name else ("x", "y", "sample_weight")
    check_rows(names[0], x, method)
    if is_dataset(x):
        check_batched(names[0], x, model)
        return
    check_dense(names[0], x, model)
    check_numeric_x(names[0], x, model)
    if y is not None:
        check_dense(names[1], y, model)
        check_numeric_y(names[1], y)
        check_labels(names[1], model, y)
    if sample_weight is not None:
        check_sample_weight(names[2], model, sample_weight)


def _check_arguments(model, method, arguments):
    if "batch_size" in arguments:
        check_batch_size(arguments["batch_size"])
    x, y = arguments.get("x"), arguments.get("y")
    check_data(model, method, x, y, arguments.get("sample_weight"))
    if arguments.get("validation_data") is not None:
        check_data(model, "validation", *keras.utils.unpack_x_y_sample_weight(
            arguments["validation_data"]), name="validation_data")
    if method in ("fit", "train_on_batch"):
        check_class_weight(model, arguments.get("class_weight"), x, y)


def _nothing_ran(method, result):
    """Whether `result` says no batch ran (Keras warns, at most)."""
    if method == "fit":
        history = getattr(result, "history", None)
        return bool(getattr(result, "epoch", None)) and isinstance(
            history, dict) and all(k.startswith("val_") for k in history)
    if method == "evaluate":
        return isinstance(result, (list, dict)) and not result
    return False


def checked_call(model, method, call, args, kwargs):
    """`call(*args, **kwargs)`, `model.<method>`, with its arguments checked.

    The hook of `TemplateBacked.fit`, `evaluate`, `predict`,
    `train_on_batch` and `test_on_batch`: refuses what the model's engine
    refuses first (`model.check_scope(method)`: on the TensorFlow engines,
    a call inside a strategy's scope that is not the model's) and bad data
    (`check_data`, `batch_size`, `class_weight`) before Keras runs; after
    it, a dataset of unknown size that yielded no batch (Keras returns an
    empty history, the mirrored engine raises `StopIteration`, `predict`
    `UnboundLocalError`).

    Args:
        model: A model of this package (a `TemplateBacked`).
        method: The name of the `keras.Model` method called.
        call: The method of the class after `TemplateBacked`, bound.
        args, kwargs: The call's arguments.

    Returns:
        What `call` returns.
    """
    arguments = _bound(method, model, args, kwargs)
    if arguments is None:
        return call(*args, **kwargs)
    validating = method == "evaluate" and internals.validates_for_fit(arguments)
    data = "validation_data" if validating else "x"
    for_what = "validation" if validating else method
    if not validating:
        model.check_scope(method)
        _check_arguments(model, method, arguments)
    try:
        result = call(*args, **kwargs)
    except StopIteration:
        if validating or has_unknown_size(arguments.get("x")):
            raise no_batch_error(data, for_what) from None
        raise
    except UnboundLocalError as error:
        if method == "predict" and "batch_outputs" in str(error):
            raise no_batch_error("x", "predict") from None
        raise
    if method in _VERB and _nothing_ran(method, result):
        raise no_batch_error(data, for_what)
    return result
