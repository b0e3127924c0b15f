"""One chain of wrappers around a model's `train_function`, in one order.

Keras's `fit` calls `model.train_function` once per step with the data
iterator (`train_on_batch` once per call, with a generator of its batch);
on JAX with the trainer's state first, `train_function(state, iterator)`,
and a chain passes its arguments on as they come (on JAX the `"resume"`
and `"monitor"` links run, and the `"guard"` link of a `model_parallel`
model, `multigpu.partition.jax_sharding`; the rest belong to TensorFlow's
engines).
Several parts of multigpu act around that call. Each registers a named
link here (`link`, `unlink`), and this module alone assigns
`model.train_function`: the links nest in the order of `ORDER`, outermost
first, whatever order they were registered in.

* `"resume"` (`multigpu.checkpoints.backup`): a resumed epoch draws the
  batches trained before the interruption without training on them
  (`multigpu.checkpoints.resume.skipping_train_function`).
* `"monitor"` (`multigpu.insight.monitor.ScalingMonitor`): times each step.
* `"guard"` (the engines, `multigpu.step.guard.Reporting`): a step that
  failed the NaN/inf check raises `NonFiniteInputError`.
* `"watch"` (the engines, `multigpu.engines.template`): notes the iterator
  the step was given, which a failed `fit` frees.

So skipped batches are neither timed nor checked, and the monitor times the
step with its check. The first two belong to one `fit` (`FIT_LINKS`): a
callback registers them at `on_train_begin` and removes them at
`on_train_end`. The other two belong to the model, which registers them
whenever it makes its train function.

A link is a function of the train function below it, returning the
function to call instead (`wrap(inner) -> function`); a party registers the
same wrap (equal by `==`: a bound method, a frozen dataclass) each time, so
that registering it again changes nothing. While a model has links, its
`train_function` is a `Chain`: the function Keras made (or the one
`fit_distributed` trains with, `based_on`) below the composed links. Removing
a link restores the very object that was there with the remaining links;
removing the last restores that function itself.

When Keras makes a new train function (`compile`, `train_function = None`
then the next `fit`, `make_train_function(force=True)`) the chain it
replaces is gone with its links: the model registers its own again
(`TensorFlowTrainer.make_train_function`, which also keeps the links of a
forced remake, `keeping_links`), a callback at its next `on_train_begin`.

A `fit` ends without `on_train_end` when it raises. The links of the fit
are then removed by the chain itself when the error comes from the train
function (anything but the end of the data), and by `fitting` around the
`fit` of multigpu's models and `fit_distributed` whatever raised. A plain
Keras model whose `fit` was stopped by an error in a callback keeps them
until a callback registers the same name again or Keras makes a new train
function.

Example:
>>> def timed(inner):
...     def train(iterator):
...         start = time.perf_counter()
...         logs = inner(iterator)
...         seconds.append(time.perf_counter() - start)
...         return logs
...     return train
>>> train_function.link(model, "monitor", timed)
>>> train_function.links(model)
('monitor',)
>>> train_function.unlink(model, "monitor")
"""

import contextlib
import weakref

from multigpu.messages import literal, literals
from multigpu.runtime import loaded_tensorflow

# The links, outermost first.
ORDER = ("resume", "monitor", "guard", "watch")
# The links that last one `fit`.
FIT_LINKS = frozenset({"resume", "monitor"})


class Chain:
    """A model's `train_function` while it has links.

    Calls the links, composed in `ORDER`, around `base`. A call that raises
    anything but the end of the data ends the `fit`: the links of the fit
    (`FIT_LINKS`) are removed from the model.

    Args:
        model: The model whose train function this is.
        base: The function below the links.
        links: `{name: wrap}`, not empty.
        known: The chains over `base` a removal may return to (shared by
            them), so that a set of links made again is the same object.
    """

    __slots__ = ("_model", "base", "links", "_call", "_known")

    def __init__(self, model, base, links, known):
        self._model = weakref.ref(model)
        self.base = base
        self.links = dict(links)
        self._known = known
        function = base
        for name in reversed(ORDER):
            if name in self.links:
                function = self.links[name](function)
        self._call = function

    def relinked(self, links):
        """The train function with `links` over `base` (`base` if none).

        A chain with those links made before over `base` is that chain.
        """
        return _chained(self._model(), self.base, links, self._known)

    def __call__(self, *args, **kwargs):
        try:
            return self._call(*args, **kwargs)
        except BaseException as error:
            model = self._model()
            if model is not None and not _end_of_data(error):
                _remove(model, FIT_LINKS)
            raise


def _end_of_data(error):
    """Whether a train function raised `error` because the data ran out.

    The epoch then ends and the fit goes on: `StopIteration`, or on a
    `tf.data` input TensorFlow's `OutOfRangeError` (which exists only once
    TensorFlow is imported).
    """
    if isinstance(error, StopIteration):
        return True
    tf = loaded_tensorflow()
    return tf is not None and isinstance(error, tf.errors.OutOfRangeError)


def _set(model, function):
    """The one assignment of `model.train_function`."""
    model.train_function = function


def _chained(model, base, links, known):
    """`links` over `base`: a chain of `known` or a new one; `base` if none.

    `known` keeps the chains a removal may return to: those whose links
    are among the new chain's.
    """
    if not links:
        return base
    chain = next((c for c in known if c.links == links), None)
    if chain is None:
        chain = Chain(model, base, links, known)
        known.append(chain)
    known[:] = [c for c in known if c.links.items() <= links.items()]
    return chain


def _remove(model, names):
    """Removes the links `names` that the model's chain has."""
    current = model.train_function
    if not isinstance(current, Chain):
        return
    links = {n: w for n, w in current.links.items() if n not in names}
    if len(links) != len(current.links):
        _set(model, current.relinked(links))


def _check_name(name):
    if name not in ORDER:
        raise ValueError(
            f"Invalid `name`: received {literal(name)}; expected one of "
            f"{literals(ORDER)} (the links of the train function, declared "
            "in multigpu.step.train_function.ORDER).")


def link(model, name, wrap):
    """Registers the link `name` of `model`'s train function.

    The model's train function becomes the chain of its links with this
    one, in `ORDER`. A model without a train function makes one first
    (`model.make_train_function()`, as `fit` does). A link of that name
    already there is replaced, unless it is `wrap` (`==`): then nothing
    changes.

    Args:
        model: A compiled `keras.Model`.
        name: One of `ORDER`.
        wrap: A function of the train function below, returning the one to
            call instead.

    Raises:
        ValueError: if `name` is not in `ORDER`, or the model makes no
            train function.

    Example:
    >>> train_function.link(model, "guard", Reporting(record, position))
    """
    _check_name(name)
    current = model.train_function
    if current is None:
        model.make_train_function()
        current = model.train_function
        if current is None:
            raise ValueError(
                f"Invalid `model`: {literal(model.name)} made no train "
                "function to link to; compile it first.")
    if not isinstance(current, Chain):
        _set(model, _chained(model, current, {name: wrap}, []))
    elif current.links.get(name) != wrap:
        _set(model, current.relinked({**current.links, name: wrap}))


def unlink(model, name):
    """Removes the link `name` of `model`'s train function, if it has it.

    The model's train function becomes the chain of the remaining links,
    the very object it was with them; without links, the function below
    them. A train function that is not a chain (Keras made a new one since)
    is left as it is.

    Args:
        model: A `keras.Model`.
        name: One of `ORDER`.

    Raises:
        ValueError: if `name` is not in `ORDER`.

    Example:
    >>> train_function.unlink(model, "monitor")
    """
    _check_name(name)
    _remove(model, {name})


def links(model):
    """The names of the links of `model`'s train function, outermost first.

    Example:
    >>> train_function.links(parallel)
    ('guard', 'watch')
    """
    current = getattr(model, "train_function", None)
    if not isinstance(current, Chain):
        return ()
    return tuple(name for name in ORDER if name in current.links)


def base(model):
    """The function below the links of `model`'s train function.

    Returns:
        Keras's train function (or `fit_distributed`'s) without the links;
        the train function itself when it has none (None when there is
        none).
    """
    current = getattr(model, "train_function", None)
    return current.base if isinstance(current, Chain) else current


def rebase(model, function):
    """Puts `function` below the links of `model`'s train function.

    For an engine whose step needs more than the function Keras made (the
    JAX engine's: each batch placed on the devices first): it hands its
    own version of Keras's function here, and the links the model has wrap
    it as they wrapped the one it replaces.

    Args:
        model: A `keras.Model`.
        function: The train function the model's links wrap from now on.

    Example:
    >>> keras.Model.make_train_function(model)
    >>> train_function.rebase(model, placed(train_function.base(model)))
    """
    current = model.train_function
    links = current.links if isinstance(current, Chain) else {}
    _set(model, _chained(model, function, links, []))


def discard(model):
    """Drops `model`'s train function and its links.

    Keras makes a new one, tracing the step again, at the next `fit` or
    `train_on_batch` (what `compile` does).

    Example:
    >>> train_function.discard(model)  # the step reads a changed setting
    """
    _set(model, None)


@contextlib.contextmanager
def keeping_links(model):
    """A block that may make a new train function, keeping the links.

    When the block replaces a chain by a new function (Keras's
    `make_train_function(force=True)`), the chain's links are linked to
    the new one.

    Example:
    >>> with train_function.keeping_links(model):
    ...     keras.Model.make_train_function(model, force=True)
    """
    before = model.train_function
    yield
    after = model.train_function
    if (isinstance(before, Chain) and after is not None
            and not isinstance(after, Chain)):
        _set(model, _chained(model, after, before.links, []))


@contextlib.contextmanager
def fitting(model):
    """A block that runs one `fit` of `model`.

    The links of the fit (`FIT_LINKS`) registered in the block and still
    there when it ends, as after a `fit` that raised before
    `on_train_end`, are removed.

    Example:
    >>> with train_function.fitting(model):
    ...     keras.Model.fit(model, x, y)
    """
    current = model.train_function
    before = dict(current.links) if isinstance(current, Chain) else {}
    try:
        yield
    finally:
        current = model.train_function
        if isinstance(current, Chain):
            _remove(model, {name for name in FIT_LINKS & current.links.keys()
                            if before.get(name) != current.links[name]})


@contextlib.contextmanager
def based_on(model, function):
    """A block in which `model` trains through `function`, a train function.

    Links registered in the block wrap `function`; the model's train
    function (a chain, Keras's or None) is restored after the block,
    whatever happens in it.

    Args:
        model: A `keras.Model`.
        function: A function of an iterator of batches that trains one step
            and returns the logs.

    Example:
    >>> with train_function.based_on(model, own_train_function):
    ...     callbacks.on_train_begin()
    ...     model.train_function(iter([batch]))
    """
    saved = model.train_function
    _set(model, function)
    try:
        yield
    finally:
        _set(model, saved)
