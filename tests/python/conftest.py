"""Test set-up: 4 logical CPU devices, configured once before TensorFlow starts."""

import gc
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Helpers the R tests use too (R CMD check ships tests/, not tests/python).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "shared"))

import multigpu

NUM_DEVICES = 4
DEVICES = multigpu.virtual_devices(NUM_DEVICES)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Fixtures every folder's tests use: `slurm` (a working local Slurm); the
# suite's tiers (`make test` runs the gate, `make test-full` everything).
pytest_plugins = ("support.slurm", "support.tiers")


@pytest.fixture(autouse=True)
def _seeded():
    # What the previous test's fixtures left (pytest lets go of their values
    # only after that test's teardown) is collected here, and what survives
    # is frozen (_collect_garbage).
    _collect_garbage(freeze=True)
    keras.utils.set_random_seed(1234)
    yield
    # Freeing an aged tf.data iterator can wait up to a minute for its
    # threads (docs/tf-data-stall.md); a failed fit frees its own before it
    # raises. Garbage is collected here, so that any other such wait falls
    # in the teardown of the test that left the iterator, which --durations
    # names, not in whichever later test a collection happens to run. A
    # failed test's frames, which pytest keeps for post-mortem debugging
    # (sys.last_traceback, until the next failure), are let go first.
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    _collect_garbage(freeze=False)


@pytest.fixture
def mixed_float16():
    """Keras's global dtype policy is `mixed_float16` in the test."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy(previous)


def _collect_garbage(freeze):
    """A collection that walks only what was allocated since the last freeze.

    TensorFlow keeps every graph it traced alive (about 14,000 Python
    objects per model fitted; keras.backend.clear_session() frees none of
    them), so a full collection after each test walked a heap that grew
    all through a worker's life, and so did the automatic collections
    during tracing. gc.freeze() moves what survived out of the collector's
    sight for good: the objects of module- and session-scoped fixtures,
    which live past a test, are never collected (a leak of a few models).
    """
    gc.collect()
    if freeze:
        gc.freeze()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "bench_quick: checks the benchmark harness's outputs: "
        "`make bench-quick` runs them on its own run's outputs "
        "(MULTIGPU_BENCH_QUICK_OUTPUT), so `make test-python` leaves them out")


# The longest tests (about 10 s and more each; most of them start
# processes) start first, in this order: pytest-xdist's workers then end the
# run on short tests, and no worker is left running a long one while the
# other has nothing left to do.
LONG_TESTS_FIRST = (
    "checkpoints/test_resume.py::test_killed_anywhere_twice",
    "cluster/test_slurm.py::",
    "distribute/test_fit_distributed.py::test_multi_worker_checkpoints",
    "checkpoints/test_checkpoints.py::test_sigkill_mid_epoch",
    "distribute/test_fit_distributed.py::test_two_workers",
    "engines/test_layer_zoo.py::test_a_layer_family_trains_as_on_one_device"
    "[rnn_dropout",
    "engines/test_training_again.py::",
    "engines/test_layer_zoo.py::test_a_layer_family_trains_as_on_one_device"
    "[masked_rnns",
    "engines/test_failed_fit.py::test_after_three_failed_fits",
    "checkpoints/test_checkpoints.py::test_a_really_full_disk",
    "test_launch.py::",
    "engines/test_published_models.py::",
)


def _start_rank(item):
    for rank, name in enumerate(LONG_TESTS_FIRST):
        if name in item.nodeid:
            return rank
    return len(LONG_TESTS_FIRST)


def pytest_collection_modifyitems(items):
    items.sort(key=_start_rank)  # stable: the rest keep their order


# A teardown this long is a stall to find (a freed iterator waiting for its
# threads: docs/tf-data-stall.md), not work: the summary names each one.
SLOW_TEARDOWN_SECONDS = 10.0
_slow_teardowns = []


def pytest_runtest_logreport(report):
    if report.when == "teardown" and report.duration > SLOW_TEARDOWN_SECONDS:
        _slow_teardowns.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter):
    """One line on teardowns over SLOW_TEARDOWN_SECONDS (with pytest-xdist,
    the controller sees every worker's reports)."""
    if _slow_teardowns:
        terminalreporter.section(
            f"teardowns over {SLOW_TEARDOWN_SECONDS:.0f} s", yellow=True)
        for nodeid, seconds in _slow_teardowns:
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
    else:
        terminalreporter.write_line(
            f"no teardown took over {SLOW_TEARDOWN_SECONDS:.0f} s")


@pytest.fixture
def rng():
    return np.random.default_rng(7)


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Ends a process that embedded R (`embedded_r.py`) at once.

    Python's finalization then runs R's, reticulate's and TensorFlow's
    exit handlers in an order none of them expects, and the process can
    die of a segmentation fault after every test passed. The report is
    written by now; the exit status is the session's.
    """
    embedded = sys.modules.get("support.embedded_r")
    if embedded is None or not embedded.EmbeddedR.started:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(config.stash.get(_EXIT_STATUS, 1))
