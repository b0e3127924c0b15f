"""The arguments of `checkpoint_callbacks` and `make_or_restore_model`, checked.

Each check raises a `ValueError` naming the argument, the value and the fix,
before any training, so that no epoch is lost to a bad directory.
"""

import os

from multigpu.arguments import check_int
from multigpu.messages import literal

# The directory inside `checkpoint_dir` that holds the training state.
BACKUP_NAME = "backup"


def check_save_freq(save_freq):
    """`save_freq` as `"epoch"` or an int >= 1.

    Raises:
        ValueError: for any other value.
    """
    if isinstance(save_freq, str) and save_freq == "epoch":
        return save_freq
    return check_int("save_freq", save_freq, 1, expected=(
        f"{literal('epoch')} (checkpoint at the end of every epoch) or an int "
        ">= 1 (checkpoint every that many batches)"))


def check_directory(checkpoint_dir):
    """`checkpoint_dir` as a path string; it need not exist yet.

    Raises:
        ValueError: if it is not a path, or names a file.
    """
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not os.fspath(
        checkpoint_dir
    ):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(checkpoint_dir)}; "
            "expected a directory path (created if missing)."
        )
    directory = os.fspath(checkpoint_dir)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
            "is a file; expected a directory."
        )
    return directory


def check_max_to_keep(max_to_keep):
    """`max_to_keep` as an int >= 1, or None (keep all).

    Raises:
        ValueError: for any other value.
    """
    if max_to_keep is None:
        return None
    return check_int("max_to_keep", max_to_keep, 1, expected=(
        "an int >= 1 (keep that many newest ckpt-*.keras models) or "
        f"{literal(None)} (keep all)"))


def check_creatable(directory):
    """Creates `directory` if missing.

    Raises:
        ValueError: if it cannot be created.
    """
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
            f"cannot be created ({type(error).__name__}: {error.strerror}); "
            "expected a directory path whose parents are directories."
        ) from None


def check_writable(directory):
    """Creates `directory` if missing and checks this process may write it.

    Raises:
        ValueError: if it cannot be created or written.
    """
    check_creatable(directory)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
            "this process cannot write to; checked before training so no "
            "epoch is lost. Choose a writable directory or fix its "
            "permissions."
        )


def check_backup_path(directory):
    """Checks that `directory/backup` is free for the training state.

    Raises:
        ValueError: if a file (not a directory) of that name is there.
    """
    backup = os.path.join(directory, BACKUP_NAME)
    if os.path.exists(backup) and not os.path.isdir(backup):
        raise ValueError(
            f"Invalid `checkpoint_dir`: received {literal(directory)}, which "
            f"holds a file named {literal(BACKUP_NAME)} where checkpoint_callbacks "
            "keeps the training state (a directory of that name); checked "
            "before training so no epoch is lost. Move or rename that file, "
            "or choose another checkpoint_dir."
        )
