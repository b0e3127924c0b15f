"""Device resolution and simulated devices."""

import functools
import json
import os
import subprocess
import textwrap
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from conftest import DEVICES
from multigpu import devices as devices_lib
from multigpu.runtime import tensorflow as tensorflow_runtime
from support.worker_scripts import fresh_python

CPUS = [f"/device:CPU:{i}" for i in range(4)]


def fake_machine(monkeypatch, gpus=0, cpus=1):
    """Makes the resolver see a machine with that many logical devices."""
    listing = {
        "GPU": [f"/device:GPU:{i}" for i in range(gpus)],
        "CPU": [f"/device:CPU:{i}" for i in range(cpus)],
    }
    monkeypatch.setattr(tensorflow_runtime, "logical_devices", listing.__getitem__)
    devices_lib.STATE.reset()


@pytest.fixture(autouse=True)
def fresh_warnings():
    devices_lib.STATE.reset()


def test_conftest_configured_four_logical_cpus():
    assert DEVICES == CPUS
    assert [d.name for d in tf.config.list_logical_devices("CPU")] == CPUS


def test_none_uses_every_logical_cpu_with_one_time_warning():
    with pytest.warns(UserWarning, match="No GPU found"):
        assert multigpu.resolve_devices(None) == CPUS
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert multigpu.resolve_devices(None) == CPUS


@pytest.mark.parametrize("count", [2, 3, 4, np.int64(2)])
def test_count_takes_the_first_devices(count):
    with pytest.warns(UserWarning, match="logical CPU"):
        assert multigpu.resolve_devices(count) == CPUS[: int(count)]


@pytest.mark.parametrize(
    "names, expected",
    [
        (["/cpu:1", "/device:CPU:3"], ["/device:CPU:1", "/device:CPU:3"]),
        (("cpu:2", "/CPU:0"), ["/device:CPU:2", "/device:CPU:0"]),
        (["/job:localhost/replica:0/task:0/device:CPU:1", "/cpu:2"],
         ["/device:CPU:1", "/device:CPU:2"]),
    ],
)
def test_device_names_are_canonicalised(names, expected):
    assert multigpu.resolve_devices(names) == expected


@pytest.mark.parametrize(
    "gpus, problem",
    [
        (1, "must be >= 2, not 1"),
        (0, "must be >= 2, not 0"),
        (-2, "must be >= 2, not -2"),
        (True, "True is neither a device count nor a device set."),
        (2.5, "type float"),
        (2.0, "A device count is an int, not the float 2.0."),
        ([], "at least 2 entries, not 0"),
        ([0], "at least 2 entries, not 1"),
        (["/cpu:1"], "at least 2 entries, not 1"),
        (5, "5 devices were asked for but only 4 logical CPU"),
        ([0, 1], "GPU ids were given but this machine has no GPU"),
        (["/cpu:0", "/cpu:0"], "appear more than once"),
        (["/cpu:0", "/device:CPU:0"], "appear more than once"),
        (["/cpu:0", "/cpu:9"], "Unknown device(s) ['/cpu:9']"),
        (["/gpu:0", "/gpu:1"], "Unknown device(s)"),
        (["/cpu:0", "banana"], "'banana' is not a local device name"),
        ([0, 1.5], "Entries [1.5] are neither GPU ids nor device names"),
        ([0, "/cpu:1"], "mixes GPU ids and device names"),
        ("/cpu:0", "A single device name is not a device set"),
        ({"gpus": 2}, "type dict"),
    ],
)
def test_invalid_gpus_name_value_expectation_and_machine(gpus, problem):
    with pytest.raises(ValueError) as caught:
        multigpu.resolve_devices(gpus)
    message = str(caught.value)
    assert f"received {gpus!r}" in message
    assert problem in message
    assert "Expected None" in message
    assert "This machine has GPUs: none; CPU devices: /device:CPU:0" in message


def test_gpu_machine_none_uses_all_gpus_without_warning(monkeypatch):
    fake_machine(monkeypatch, gpus=3, cpus=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert multigpu.resolve_devices(None) == [
            "/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]


def test_gpu_machine_counts_ids_and_names(monkeypatch):
    fake_machine(monkeypatch, gpus=4, cpus=1)
    assert multigpu.resolve_devices(2) == ["/device:GPU:0", "/device:GPU:1"]
    assert multigpu.resolve_devices([3, 1]) == ["/device:GPU:3", "/device:GPU:1"]
    assert multigpu.resolve_devices(["/gpu:2", "gpu:0"]) == [
        "/device:GPU:2", "/device:GPU:0"]
    assert multigpu.resolve_devices(["/gpu:1", "/cpu:0"]) == [
        "/device:GPU:1", "/device:CPU:0"]


@pytest.mark.parametrize(
    "gpus, problem",
    [
        ([0, 4], "GPU id(s) [4] are out of range 0..3"),
        ([-1, 0], "GPU id(s) [-1] are out of range"),
        ([1, 1], "['/device:GPU:1'] appear more than once"),
        (5, "5 devices were asked for but only 4 GPU(s) exist"),
        (["/gpu:0", "/gpu:7"], "Unknown device(s) ['/gpu:7']"),
    ],
)
def test_gpu_machine_invalid_ids(monkeypatch, gpus, problem):
    fake_machine(monkeypatch, gpus=4, cpus=1)
    with pytest.raises(ValueError) as caught:
        multigpu.resolve_devices(gpus)
    assert problem in str(caught.value)
    assert "GPUs: /device:GPU:0, /device:GPU:1" in str(caught.value)


@pytest.mark.parametrize("gpus, cpus, expected", [
    (1, 1, "/device:GPU:0"), (0, 1, "/device:CPU:0")])
def test_single_device_machine_runs_on_it_with_warning(
        monkeypatch, gpus, cpus, expected):
    fake_machine(monkeypatch, gpus=gpus, cpus=cpus)
    with pytest.warns(UserWarning, match="Only one device"):
        assert multigpu.resolve_devices(None) == [expected]


def test_single_cpu_machine_rejects_a_count(monkeypatch):
    fake_machine(monkeypatch, gpus=0, cpus=1)
    with pytest.raises(ValueError, match="only 1 logical CPU device"):
        multigpu.resolve_devices(2)


def test_gpu_machine_does_not_fall_back_to_cpus_for_counts(monkeypatch):
    fake_machine(monkeypatch, gpus=2, cpus=4)
    with pytest.raises(ValueError, match="only 2 GPU"):
        multigpu.resolve_devices(3)


def test_available_devices_lists_both_kinds():
    assert multigpu.available_devices() == {"GPU": [], "CPU": CPUS}


def test_virtual_devices_is_idempotent_for_the_same_n():
    assert multigpu.virtual_devices(4) == CPUS


def test_virtual_devices_while_objects_exist_explains_instead_of_tf_error():
    kept = [tf.Variable(1.0), tf.constant([1.0, 2.0]),
            keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])]
    with pytest.raises(RuntimeError) as caught:
        multigpu.virtual_devices(3)
    message = str(caught.value)
    assert "multigpu.virtual_devices(3) came too late" in message
    assert "with 4 logical CPU device(s)" in message
    assert "Keras model" in message
    assert "variable" in message and "tensor" in message
    assert "first thing, before building a model" in message
    assert multigpu.available_devices()["CPU"] == CPUS
    del kept


def test_virtual_devices_restarts_tensorflow_started_by_a_tensor_now_gone():
    """keras3's load hook in R starts TensorFlow with a tensor it drops."""
    stderr = _virtual_devices_in_a_fresh_process(
        "import keras, tensorflow as tf\n"
        "keras.ops.convert_to_tensor([1])  # TensorFlow starts, 1 device\n"
        "assert len(tf.config.list_logical_devices('CPU')) == 1\n"
        "print(multigpu.virtual_devices(2))\n"
        "assert len(tf.config.list_logical_devices('CPU')) == 2\n"
        "model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])\n"
        "parallel = multigpu.multi_gpu_model(model, gpus=2)\n"
        "parallel.compile(optimizer='sgd', loss='mse')\n"
        "parallel.fit(tf.ones((8, 3)), tf.ones((8, 2)), verbose=0)\n"
        "import sys; print('trained', file=sys.stderr)\n")
    assert "trained" in stderr


@pytest.mark.parametrize("kwargs, problem", [
    (dict(n=0), "Invalid `n`: received 0"),
    (dict(n=2.5), "Invalid `n`: received 2.5"),
    (dict(n=True), "Invalid `n`: received True"),
    (dict(n=2, device_type="TPU"), "Invalid `device_type`: received 'TPU'"),
    (dict(n=2, memory_limit=512), "memory_limit applies to GPUs only"),
    (dict(n=2, device_type="GPU"), "received None; splitting a GPU needs"),
    (dict(n=2, device_type="GPU", memory_limit=-1), "received -1"),
    (dict(n=2, device_type="GPU", memory_limit=1024), "has no physical GPU"),
    (dict(n=2, threads=-1), "Invalid `threads`: received -1"),
    (dict(n=2, threads=1.5), "Invalid `threads`: received 1.5"),
    (dict(n=2, threads="2"), "Invalid `threads`: received '2'"),
    (dict(n=2, device_type="GPU", memory_limit=1024, threads=2),
     "threads applies to logical CPU devices only"),
])
def test_virtual_devices_rejects_bad_arguments(kwargs, problem):
    with pytest.raises(ValueError) as caught:
        multigpu.virtual_devices(**kwargs)
    assert problem in str(caught.value)


def test_virtual_devices_splits_a_gpu_with_memory_limits(monkeypatch):
    """The GPU path, on a mocked physical GPU (no GPU exists here)."""
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    calls = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [gpu] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "get_logical_device_configuration",
                        lambda device: None)
    monkeypatch.setattr(tf.config, "set_logical_device_configuration",
                        lambda device, configs: calls.append((device, configs)))
    names = multigpu.virtual_devices(2, "gpu", memory_limit=2048)
    assert names == ["/device:GPU:0", "/device:GPU:1"]
    (device, configs), = calls
    assert device is gpu
    assert [c.memory_limit for c in configs] == [2048, 2048]


def thread_pools(n, threads, env=None, before=""):
    """What `virtual_devices(n, threads=threads)` set up, in a fresh process.

    Returns the intra-op threads TensorFlow was configured with, whether
    devices own their pools, and the process's thread count once the
    devices exist (each pool's threads are started with its device).
    """
    script = textwrap.dedent(f"""
        import json, os
        import tensorflow as tf
        import multigpu
        {before}
        multigpu.virtual_devices({n}, threads={threads!r})
        tf.config.list_logical_devices()
        print(json.dumps(dict(
            intra=tf.config.threading.get_intra_op_parallelism_threads(),
            own=os.environ.get("TF_OVERRIDE_GLOBAL_THREADPOOL"),
            threads=len(os.listdir("/proc/self/task")))))
    """)
    # This test process split its CPU already, and children inherit that.
    inherited = {k: v for k, v in os.environ.items()
                 if k != "TF_OVERRIDE_GLOBAL_THREADPOOL"}
    result = subprocess.run(
        fresh_python(script), capture_output=True, text=True,
        timeout=600, env={**inherited, "TF_CPP_MIN_LOG_LEVEL": "2",
                          **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


@functools.cache
def plain_thread_pools(n, threads):
    """`thread_pools(n, threads)` with no environment or code before, once
    per test process: several tests compare with the same set-up."""
    return thread_pools(n, threads)


def test_each_logical_cpu_device_owns_a_pool_of_threads():
    three, one = plain_thread_pools(2, 3), thread_pools(2, 1)
    assert (three["intra"], three["own"]) == (3, "1")
    assert (one["intra"], one["own"]) == (1, "1")
    # Two devices with a pool each: 2 x (3 - 1) more threads.
    assert three["threads"] - one["threads"] == 4


def test_threads_default_to_each_devices_share_of_the_cores():
    shared = thread_pools(2, None)
    assert shared["intra"] == max(1, len(os.sched_getaffinity(0)) // 2)
    assert shared["own"] == "1"


# Full tier: a fresh process per setting; the gate checks the default and the pools.
@pytest.mark.full
def test_threads_zero_keeps_tensorflows_one_shared_pool():
    shared = thread_pools(2, 0)
    assert (shared["intra"], shared["own"]) == (0, None)
    inherited = thread_pools(2, 0, env={"TF_OVERRIDE_GLOBAL_THREADPOOL": "1"})
    assert inherited["own"] is None
    assert inherited["threads"] == shared["threads"]


# Two more fresh TensorFlow processes for the settings a program makes
# before multigpu: the full tier's (the gate checks the pools above).
@pytest.mark.full
def test_threads_the_program_set_are_kept_per_device():
    from_api = thread_pools(
        2, None, before="tf.config.threading.set_intra_op_parallelism_threads(3)")
    assert (from_api["intra"], from_api["own"]) == (3, "1")
    from_env = thread_pools(2, None, env={"TF_NUM_INTRAOP_THREADS": "3"})
    # TensorFlow reads the variable itself; the session setting stays unset.
    assert (from_env["intra"], from_env["own"]) == (0, "1")
    assert from_env["threads"] == plain_thread_pools(2, 3)["threads"]


def test_usable_cores_falls_back_to_cpu_count_without_affinity(monkeypatch):
    """macOS and Windows have no `os.sched_getaffinity`."""
    from multigpu.devices import usable_cores

    assert usable_cores() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert usable_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cores() == 1


def _virtual_devices_in_a_fresh_process(code):
    """Runs `code` after `import multigpu` in a new Python; returns stderr."""
    result = subprocess.run(
        fresh_python("import multigpu\n" + code, "-W", "always"),
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stderr


# Full tier: a warning in a fresh process; the gate runs the pools' own test.
@pytest.mark.full
def test_far_more_devices_than_cores_warn_once():
    from multigpu import devices
    many = devices.OVERSUBSCRIPTION * devices.usable_cores() + 1
    stderr = _virtual_devices_in_a_fresh_process(
        f"multigpu.virtual_devices({many})\n")
    assert f"multigpu.virtual_devices({many}) creates {many} logical CPU" \
        in stderr
    assert stderr.count("more than") == 1


# Full tier: a warning in a fresh process; the gate runs the pools' own test.
@pytest.mark.full
def test_a_repeated_call_with_other_threads_warns_that_it_is_ignored():
    stderr = _virtual_devices_in_a_fresh_process(
        "multigpu.virtual_devices(2, threads=1)\n"
        "multigpu.virtual_devices(2, threads=1)\n"
        "multigpu.virtual_devices(2)\n"
        "multigpu.virtual_devices(2, threads=2)\n")
    assert stderr.count("is ignored") == 1
    assert "multigpu.virtual_devices(2, threads=2) is ignored" in stderr
    assert "already exist with threads=1" in stderr
