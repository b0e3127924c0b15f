"""One chain wraps `model.train_function`; callbacks only register links.

The links nest in the order `multigpu.step.train_function.ORDER` declares,
whatever order the callbacks come in; removing them restores the very
function that was there, after a `fit` that ends and one that raises; they
outlast Keras making a new train function; and no module but the chain's
assigns `train_function` (nor patches `compute_loss` on a model).
"""

import ast
import gc
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from conftest import DEVICES
from multigpu.step import train_function as chain
from multigpu.step.nonfinite import NonFiniteInputError
from support.models import copy_of, data, max_weight_difference, mlp

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "python" / "multigpu"
ROWS, BATCH, EPOCHS = 48, 8, 2     # 6 batches an epoch
BAD_BATCH = 4                      # the 5th, after the save at batch 4
FULL = ("resume", "monitor", "guard", "watch")

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")


class LinksSeen(keras.callbacks.Callback):
    """Records the links of the train function at every batch."""

    def on_train_begin(self, logs=None):
        self.seen = set()

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.add(chain.links(self.model))


class Remakes(keras.callbacks.Callback):
    """Makes the train function anew (forced) after the second batch."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            self.model.make_train_function(force=True)


def _clean_and_bad(rng):
    x, y = data(rng, ROWS)
    bad = x.copy()
    bad[BAD_BATCH * BATCH + 1, 0] = np.nan
    return x, y, bad


def _callbacks(tmp_path, monitor_first):
    monitor = multigpu.ScalingMonitor(baseline_steps=0, warn=False)
    checkpoints = multigpu.checkpoint_callbacks(tmp_path, save_freq=2)
    ordered = [monitor, *checkpoints] if monitor_first else [*checkpoints,
                                                                monitor]
    return monitor, [*ordered, LinksSeen()]


def _fit(model, x, y, callbacks=None, epochs=EPOCHS):
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False,
                     verbose=0, callbacks=callbacks)


# The other callback order, the same links, in the full tier.
@pytest.mark.parametrize("monitor_first", [
    True, pytest.param(False, marks=pytest.mark.full)],
    ids=["monitor-first", "checkpoints-first"])
def test_the_links_nest_in_one_order_whatever_the_callback_order(
        rng, tmp_path, monitor_first):
    """A guarded multi_gpu_model stopped by a NaN batch, then resumed.

    The first fit stops at batch 5 (saved after batch 4); the second skips
    batches 1-4 (the resume link, outermost: the monitor times none of
    them), trains on, and ends with the weights and the second epoch's
    loss of an uninterrupted fit.
    """
    x, y, bad = _clean_and_bad(rng)
    template = mlp()
    twin = copy_of(template)
    results = {}
    for name, first_monitor in (("given", monitor_first),
                                ("swapped", not monitor_first)):
        model = multigpu.multi_gpu_model(copy_of(template), gpus=DEVICES[:2])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        before = model.make_train_function()
        assert chain.links(model) == ("guard", "watch")
        monitor, callbacks = _callbacks(tmp_path / name, first_monitor)
        with pytest.raises(NonFiniteInputError) as caught:
            _fit(model, bad, y, callbacks)
        assert caught.value.step == BAD_BATCH
        assert callbacks[-1].seen == {("monitor", "guard", "watch")}
        # Gone with the fit that raised; the model's own links stay.
        assert model.train_function is before
        history = _fit(model, x, y, callbacks)
        assert callbacks[-1].seen == {FULL}
        assert model.train_function is before
        trained = ROWS // BATCH * EPOCHS - BAD_BATCH
        assert monitor.summary()["steps"] == trained - monitor.warmup_steps
        results[name] = (model, history.history["loss"])

    expected = multigpu.multi_gpu_model(twin, gpus=DEVICES[:2])
    expected.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    want = _fit(expected, x, y).history["loss"]
    (given, given_loss), (swapped, swapped_loss) = results.values()
    assert max_weight_difference(given.template, swapped.template) == 0
    np.testing.assert_array_equal(given_loss, swapped_loss)
    assert max_weight_difference(given.template, twin) < 1e-6
    np.testing.assert_allclose(given_loss[-1], want[-1], rtol=1e-6)


def _checked(x, y):
    """A dataset whose batch with a NaN fails inside the train function.

    Without tf.data's autotuning: a plain model's failed `fit` leaves
    Keras's iterator to the garbage collector, and freeing an iterator with
    an autotuning thread can wait up to a minute (docs/tf-data-stall.md).
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).map(
        lambda x, y: (tf.debugging.check_numerics(x, "bad batch"), y)
    ).with_options(options)


# The other callback order, the same links, in the full tier.
@pytest.mark.parametrize("monitor_first", [
    True, pytest.param(False, marks=pytest.mark.full)],
    ids=["monitor-first", "checkpoints-first"])
def test_a_plain_model_under_a_strategy_gets_its_keras_function_back(
        rng, tmp_path, monitor_first):
    x, y, bad = _clean_and_bad(rng)
    strategy = multigpu.mirrored_strategy(2)
    with strategy.scope():
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        expected = copy_of(model)
        expected.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.make_train_function()
    keras_function = model.train_function
    monitor, callbacks = _callbacks(tmp_path, monitor_first)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bad batch"):
        model.fit(_checked(bad, y), epochs=EPOCHS, verbose=0, shuffle=False,
                  callbacks=callbacks)
    # Keras's own fit leaves its iterator in a reference cycle when it
    # raises: collected now, while young, it frees at once; left to the
    # teardown's collection, aged, freeing it can stall for seconds
    # (docs/tf-data-stall.md).
    gc.collect()
    assert callbacks[-1].seen == {("monitor",)}
    assert model.train_function is keras_function
    history = model.fit(_checked(x, y), epochs=EPOCHS, verbose=0, shuffle=False,
                        callbacks=callbacks)
    assert callbacks[-1].seen == {("resume", "monitor")}
    assert model.train_function is keras_function
    trained = ROWS // BATCH * EPOCHS - BAD_BATCH
    assert monitor.summary()["steps"] == trained - monitor.warmup_steps
    want = expected.fit(_checked(x, y), epochs=EPOCHS, verbose=0,
                        shuffle=False)
    assert max_weight_difference(model, expected) < 1e-6
    np.testing.assert_allclose(history.history["loss"][-1],
                               want.history["loss"][-1], rtol=1e-6)


def test_the_links_go_with_a_fit_a_callback_stopped(rng):
    """multi_gpu_model's `fit` removes the fit's links whatever raised."""
    x, y = data(rng, ROWS)
    model = multigpu.multi_gpu_model(mlp(), gpus=DEVICES[:2])
    model.compile(optimizer="sgd", loss="mse")
    before = model.make_train_function()

    class Stops(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("stopped by a callback")

    monitor = multigpu.ScalingMonitor(baseline_steps=0, warn=False)
    with pytest.raises(RuntimeError, match="stopped by a callback"):
        _fit(model, x, y, [monitor, Stops()])
    assert model.train_function is before


def test_a_forced_remake_keeps_the_links(rng):
    x, y = data(rng, ROWS)
    model = multigpu.multi_gpu_model(mlp(), gpus=DEVICES[:2])
    model.compile(optimizer="sgd", loss="mse")
    model.make_train_function()
    base = chain.base(model)
    model.make_train_function(force=True)
    assert chain.links(model) == ("guard", "watch")
    assert chain.base(model) is not base
    # In the middle of a fit: the monitor's link stays, every step timed.
    monitor = multigpu.ScalingMonitor(baseline_steps=0, warn=False)
    seen = LinksSeen()
    _fit(model, x, y, [monitor, Remakes(), seen])
    assert seen.seen == {("monitor", "guard", "watch")}
    assert monitor.summary()["steps"] == (ROWS // BATCH * EPOCHS
                                          - monitor.warmup_steps)
    assert chain.links(model) == ("guard", "watch")
    # The guard is there, once: a NaN batch raises the guard's error.
    bad = x.copy()
    bad[1, 0] = np.nan
    with pytest.raises(NonFiniteInputError):
        _fit(model, bad, y, epochs=1)


def test_check_finite_and_compile_make_the_links_again(rng):
    x, y = data(rng, 16)
    model = multigpu.multi_gpu_model(mlp(), gpus=DEVICES[:2])
    model.compile(optimizer="sgd", loss="mse")
    model.make_train_function()
    model.check_finite = False
    assert model.train_function is None
    model.make_train_function()
    assert chain.links(model) == ("watch",)
    model.check_finite = True
    model.make_train_function()
    assert chain.links(model) == ("guard", "watch")
    model.compile(optimizer="sgd", loss="mse")
    assert model.train_function is None
    _fit(model, x, y, epochs=1)
    assert chain.links(model) == ("guard", "watch")


def test_a_plain_model_remade_by_keras_gets_the_new_function_back(rng):
    x, y = data(rng, ROWS)
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    for remake in (lambda: model.make_train_function(force=True),
                   lambda: model.compile(optimizer="sgd", loss="mse")):
        remake()
        monitor = multigpu.ScalingMonitor(baseline_steps=0, warn=False)
        seen = LinksSeen()
        _fit(model, x, y, [monitor, seen])
        assert seen.seen == {("monitor",)}
        assert monitor.summary()["steps"] == (ROWS // BATCH * EPOCHS
                                              - monitor.warmup_steps)
        assert chain.links(model) == ()
        assert not isinstance(model.train_function, chain.Chain)


# Full tier: fit_distributed's own function runs in test_fit_distributed.py's gate tests.
@pytest.mark.full
def test_fit_distributed_trains_through_its_own_function_and_restores(rng):
    x, y = data(rng, ROWS)
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    model.make_train_function()
    keras_function = model.train_function
    monitor = multigpu.ScalingMonitor(baseline_steps=0, warn=False)
    seen = LinksSeen()
    multigpu.fit_distributed(
        model, tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
        epochs=1, verbose=0, callbacks=[monitor, seen])
    assert seen.seen == {("monitor",)}
    assert model.train_function is keras_function
    assert "compute_loss" not in vars(model)


# --- the chain itself --------------------------------------------------------


def _recording(name, calls):
    def wrap(inner):
        def train(iterator):
            calls.append(name)
            return inner(iterator)

        return train

    return wrap


@pytest.fixture
def compiled():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.parametrize("order", [FULL, FULL[::-1], ("guard", "resume",
                                                       "watch", "monitor")])
def test_links_nest_in_the_declared_order(compiled, order):
    calls = []

    def base(iterator):
        calls.append("base")
        return {"loss": 0.0}

    with chain.based_on(compiled, base):
        wraps = {name: _recording(name, calls) for name in FULL}
        states = [compiled.train_function]
        for name in order:
            chain.link(compiled, name, wraps[name])
            states.append(compiled.train_function)
        assert chain.links(compiled) == FULL
        assert compiled.train_function(None) == {"loss": 0.0}
        assert calls == [*FULL, "base"]
        # Linking the same wrap again changes nothing.
        chain.link(compiled, order[0], wraps[order[0]])
        assert compiled.train_function is states[-1]
        # Removed in reverse, each state is the very object it was.
        for name, state in zip(order[::-1], states[-2::-1]):
            chain.unlink(compiled, name)
            assert compiled.train_function is state
        assert compiled.train_function is base
    assert compiled.train_function is None


def test_rebase_puts_a_function_below_the_links_the_model_has(compiled):
    # The JAX engine's way to feed Keras's function placed batches.
    calls = []

    def made(iterator):
        calls.append("made")
        return {"loss": 1.0}

    def placed(iterator):
        calls.append("placed")
        return {"loss": 2.0}

    with chain.based_on(compiled, made):
        chain.link(compiled, "monitor", _recording("monitor", calls))
        chain.rebase(compiled, placed)
        assert chain.links(compiled) == ("monitor",)
        assert chain.base(compiled) is placed
        assert compiled.train_function(None) == {"loss": 2.0}
        assert calls == ["monitor", "placed"]
        chain.unlink(compiled, "monitor")
        assert compiled.train_function is placed
        chain.rebase(compiled, made)  # no links: the function itself
        assert compiled.train_function is made


def test_an_error_of_the_train_function_ends_the_fit_links(compiled):
    def base(iterator):
        raise next(iterator)

    with chain.based_on(compiled, base):
        for name in FULL:
            chain.link(compiled, name, _recording(name, []))
        # The end of the data ends an epoch, not the fit.
        for end in (StopIteration(), tf.errors.OutOfRangeError(None, None,
                                                               "end")):
            with pytest.raises(type(end)):
                compiled.train_function(iter([end]))
            assert chain.links(compiled) == FULL
        with pytest.raises(ValueError, match="broken"):
            compiled.train_function(iter([ValueError("broken")]))
        assert chain.links(compiled) == ("guard", "watch")


def test_a_link_needs_a_known_name_and_a_train_function(compiled):
    with pytest.raises(ValueError, match=r"Invalid `name`: received "
                       r"'timer'; expected one of 'resume', 'monitor'"):
        chain.link(compiled, "timer", _recording("timer", []))
    assert compiled.train_function is None
    chain.link(compiled, "monitor", _recording("monitor", []))
    # The model made its train function (as `fit` does) to link to it.
    assert chain.links(compiled) == ("monitor",)
    assert chain.base(compiled) is not None
    chain.unlink(compiled, "resume")  # not linked: nothing changes
    assert chain.links(compiled) == ("monitor",)


# --- one owner -----------------------------------------------------------------

OWNER = PACKAGE / "step" / "train_function.py"


def _patches(path):
    """`(line, what)` for each assignment of `train_function` or `compute_loss`
    to an attribute in `path` (`x.train_function = ...`, `setattr`, `del`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute):
                    found.append((node.lineno, part.attr))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
                and len(node.args) > 1):
            name = node.args[1]
            # An attribute named at run time may be either of the two.
            found.append((node.lineno, name.value if isinstance(
                name, ast.Constant) else DYNAMIC))
    return [(line, what) for line, what in found
            if what in ("train_function", "compute_loss", DYNAMIC)]


DYNAMIC = "an attribute named at run time"
# The setattr calls with a name given at run time, each read: none sets a
# model's train_function or compute_loss but placement/step.py, which
# puts back the function a step observation replaced (`fresh_function`).
READ_DYNAMIC_SETATTRS = {
    "insight/memory_plan.py": 1,      # a plan's own numbers
    "distribute/datasets.py": 1,      # a dataset's epoch clock
    "placement/step.py": 3,           # forget, then restore, the step function
    "internals.py": 1,                # Keras's private attributes, by name
    "tensorflow_internals.py": 1,     # TensorFlow's, likewise
}


def test_only_the_chain_assigns_the_train_function():
    patches = {str(path.relative_to(PACKAGE)): _patches(path)
               for path in sorted(PACKAGE.rglob("*.py")) if path != OWNER}
    dynamic = {p: sum(what == DYNAMIC for _, what in found)
               for p, found in patches.items()}
    assert {p: n for p, n in dynamic.items() if n} == READ_DYNAMIC_SETATTRS
    assert {p: [f for f in found if f[1] != DYNAMIC]
            for p, found in patches.items()
            if any(f[1] != DYNAMIC for f in found)} == {}
    assert [what for _, what in _patches(OWNER)] == ["train_function"]
