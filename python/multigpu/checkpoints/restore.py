"""`make_or_restore_model`: the newest checkpointed model, or a new one."""

import warnings

import keras

from multigpu.checkpoints.arguments import check_creatable, check_directory
from multigpu.checkpoints.listing import list_checkpoints
from multigpu.messages import literal


def make_or_restore_model(checkpoint_dir, build_fn):
    """Restores the newest checkpoint of `checkpoint_dir`, or builds a model.

    Call it inside the strategy's scope (`with strategy.scope():`) so that
    the restored or new model's variables are mirrored. A checkpoint that
    cannot be read is skipped with a warning (the next newest is tried).

    Args:
        checkpoint_dir: Directory written by `checkpoint_callbacks`.
        build_fn: A function of no arguments returning a new compiled model;
            called when there is no readable checkpoint.

    Returns:
        A compiled `keras.Model`: the newest checkpoint (with its optimizer
        state) or `build_fn()`.

    Raises:
        ValueError: for an invalid `checkpoint_dir`, or if `build_fn`
            returns a model that is not compiled.
        TypeError: if `build_fn` is not callable or does not return a
            `keras.Model`.

    Example:
    >>> with strategy.scope():
    ...     model = multigpu.make_or_restore_model("ckpt", get_compiled_model)
    """
    directory = check_directory(checkpoint_dir)
    if not callable(build_fn):
        raise TypeError(
            f"Invalid `build_fn`: received an object of type "
            f"{type(build_fn).__name__}; expected a function of no arguments "
            "that returns a new compiled keras.Model."
        )
    check_creatable(directory)
    for path in list_checkpoints(directory):
        try:
            return keras.models.load_model(path)
        except Exception as error:  # noqa: BLE001 - try the next one
            warnings.warn(
                f"Skipping unreadable checkpoint {literal(path)}: "
                f"{type(error).__name__}: {error}",
                UserWarning, stacklevel=2,
            )
    model = build_fn()
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `build_fn`: it returned an object of type "
            f"{type(model).__name__}; expected a compiled keras.Model."
        )
    if not getattr(model, "compiled", False):
        raise ValueError(
            f"Invalid `build_fn`: it returned the model {literal(model.name)}, "
            "which is not compiled; a restored checkpoint is compiled (with "
            "its optimizer state), so the new model must be too. Call "
            "model.compile(optimizer=..., loss=...) in build_fn before "
            "returning the model."
        )
    return model
