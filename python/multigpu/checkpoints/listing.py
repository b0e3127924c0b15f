"""The `ckpt-*.keras` models of a checkpoint directory: order and pruning.

A model saved at the end of epoch E is `ckpt-E.keras`; one saved after
batch B of epoch E (with a batch frequency) is `ckpt-E-B.keras`. Newest
means furthest in training, read from the name.
"""

import os
import re

from multigpu.checkpoints.atomic import remove_quietly

CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d+)(?:-(\d+))?\.keras$")


def checkpoint_position(name):
    """(epochs completed, batches into the next) for a checkpoint file name.

    `ckpt-3.keras` is saved after epoch 3; `ckpt-3-5.keras` after batch 5 of
    epoch 3, so after 2 complete epochs and 5 batches.

    Args:
        name: A file name matching `ckpt-E.keras` or `ckpt-E-B.keras`.

    Returns:
        A tuple of two ints.

    Example:
    >>> checkpoint_position("ckpt-3-5.keras")
    (2, 5)
    """
    match = CHECKPOINT_PATTERN.match(name)
    epoch, batch = int(match[1]), match[2]
    return (epoch, 0) if batch is None else (epoch - 1, int(batch))


def list_checkpoints(checkpoint_dir):
    """The `ckpt-*.keras` files of a directory, newest first.

    Newest means furthest in training, by the epoch and batch in the file
    name (modification times change with copies and `touch`; a resumed run
    never writes a smaller position than an older file's).

    Args:
        checkpoint_dir: A directory written by `checkpoint_callbacks`.

    Returns:
        A list of paths, newest first (empty if the directory does not
        exist).

    Example:
    >>> list_checkpoints("ckpt")
    ['ckpt/ckpt-3.keras', 'ckpt/ckpt-3-2.keras', 'ckpt/ckpt-2.keras']
    """
    if not os.path.isdir(checkpoint_dir):
        return []
    names = [n for n in os.listdir(checkpoint_dir)
             if CHECKPOINT_PATTERN.match(n)]
    names.sort(key=checkpoint_position, reverse=True)
    return [os.path.join(checkpoint_dir, n) for n in names]


def prune_checkpoints(checkpoint_dir, max_to_keep):
    """Deletes all but the `max_to_keep` newest `ckpt-*.keras` files.

    Args:
        checkpoint_dir: A directory written by `checkpoint_callbacks`.
        max_to_keep: An int >= 1, or None to keep all.

    Returns:
        The paths deleted.

    Example:
    >>> prune_checkpoints("ckpt", 2)
    ['ckpt/ckpt-2.keras']
    """
    if max_to_keep is None:
        return []
    stale = list_checkpoints(checkpoint_dir)[max_to_keep:]
    for path in stale:
        remove_quietly(path)
    return stale
