"""The epoch a seeded dataset's next iteration belongs to, owned by the dataset.

`distributed_dataset(shuffle=True, seed=...)` orders epoch e by (seed, e)
only, so that a resumed run replays the interrupted epoch exactly. Each
such dataset owns an `EpochClock`: an iteration asks it which epoch it is.
The training loop that knows (the checkpoint callbacks, given the dataset)
announces each epoch before its iteration starts; without an announcement
the clock counts the dataset's own iterations. Nothing is shared between
datasets, so two trainings in one process never see each other's epochs.

`replay_problem` says when a dataset's batches in a replayed epoch may
differ from the interrupted run's (an unseeded shuffle, random data).
"""

import threading

from multigpu import internals
from multigpu.messages import api, literal

# The attribute of a seeded dataset that holds its `EpochClock`.
EPOCH_CLOCK_ATTRIBUTE = "multigpu_epoch_clock"


class EpochClock:
    """The epochs of one dataset's iterations.

    An announcement is used by the next iteration only: a training that
    stops (an error, an interrupt) leaves nothing behind that a later
    iteration would read.

    Example:
    >>> clock = EpochClock()
    >>> clock.next_epoch(), clock.next_epoch()
    (0, 1)
    >>> clock.announce(7)
    >>> clock.next_epoch(), clock.next_epoch()
    (7, 8)
    """

    def __init__(self):
        # Iterations start on tf.data's threads, announcements come from
        # the training loop's.
        self._lock = threading.Lock()
        self._announced = None
        self._next = 0

    def announce(self, epoch):
        """Says that the dataset's next iteration is epoch `epoch`.

        Args:
            epoch: An int >= 0.

        Raises:
            ValueError: if `epoch` is not an int >= 0.
        """
        if isinstance(epoch, bool) or int(epoch) != epoch or epoch < 0:
            raise ValueError(
                f"Invalid `epoch`: received {epoch!r}; expected an int >= 0.")
        with self._lock:
            self._announced = int(epoch)

    def next_epoch(self):
        """The epoch of the iteration starting now; called once per iteration.

        Returns:
            The announced epoch if there is one (it is then used up), else
            the epoch after the previous iteration's (0 for the first).
        """
        with self._lock:
            epoch = self._next if self._announced is None else self._announced
            self._announced = None
            self._next = epoch + 1
            return epoch


def epoch_clock(dataset):
    """The `EpochClock` a dataset from `distributed_dataset` shuffles by.

    Args:
        dataset: Any object; a dataset made by `distributed_dataset(...,
            shuffle=True, seed=...)` has a clock.

    Returns:
        The dataset's `EpochClock`, or None (its order does not depend on
        the epoch, or it is not such a dataset).

    Example:
    >>> data = multigpu.distributed_dataset(x, y, 8, shuffle=True, seed=1)
    >>> epoch_clock(data).announce(3)   # the next iteration is epoch 3
    """
    clock = getattr(dataset, EPOCH_CLOCK_ATTRIBUTE, None)
    return clock if isinstance(clock, EpochClock) else None


def replay_problem(dataset):
    """Why `dataset` may give other batches when an epoch is replayed, or None.

    A resumed run replays the interrupted epoch exactly only when each
    epoch's batches depend on the epoch alone. A `shuffle` that reshuffles
    every iteration (without the epoch-keyed order of `distributed_dataset`'s
    seeded shuffle) orders epoch e by how many epochs this process has
    iterated, and random datasets draw anew.

    Args:
        dataset: A `tf.data.Dataset`.

    Returns:
        A sentence naming the transformation, or None when the dataset's
        order depends only on the epoch.
    """
    seen, pending = set(), [dataset]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        kind = type(current).__name__
        if kind == "_ShuffleDataset" and (
                internals.reshuffles_each_iteration(current)):
            return ("it shuffles with Dataset.shuffle(reshuffle_each_iteration="
                    "True), whose order in a resumed epoch differs; use "
                    f"{api('distributed_dataset', f'x, y, shuffle={literal(True)}, seed=...')}"
                    ", whose order depends on the seed and the epoch only")
        if kind in ("_RandomDataset", "RandomDataset", "_GeneratorDataset"):
            return f"it draws from {kind.strip('_')}, which is not replayed"
        try:
            pending.extend(internals.dataset_inputs(current))
        except (AttributeError, TypeError):
            pass
    return None
