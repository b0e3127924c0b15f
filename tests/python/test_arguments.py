"""The shared argument checks: what they accept and how they refuse."""

import numpy as np
import pytest

from multigpu.arguments import check_flag, check_int, is_int


def test_is_int_takes_python_and_numpy_integers_but_no_bools():
    assert is_int(3) and is_int(np.int64(3)) and is_int(np.array(3))
    assert not any(is_int(v) for v in (True, np.bool_(True), 3.0, "3", [3],
                                       np.array([3])))


def test_check_int_returns_a_python_int_at_or_above_the_minimum():
    assert check_int("n", np.int32(2), 1) == 2
    assert type(check_int("n", np.int32(2), 1)) is int
    assert check_int("epochs", 0, 0) == 0


@pytest.mark.parametrize("value", [0, -1, 1.0, True, "2", None])
def test_check_int_names_the_argument_the_value_and_the_minimum(value):
    with pytest.raises(ValueError, match=r"^Invalid `n`: received .*; expected an int >= 1\.$"):
        check_int("n", value, 1)


def test_check_int_says_what_else_is_expected():
    with pytest.raises(ValueError, match=r"expected 'epoch' or an int >= 1\.$"):
        check_int("save_freq", "daily", 1, expected="'epoch' or an int >= 1")


def test_check_flag_takes_numpy_bools():
    assert check_flag("shuffle", np.bool_(False)) is False
    with pytest.raises(ValueError, match=r"`shuffle`: received 1; expected True or False"):
        check_flag("shuffle", 1)


# -- bad arguments of the public functions, answered with the fix ----------
# (Cheap: no training except where the failure only showed in `fit`.)

import os  # noqa: E402

import keras  # noqa: E402

import multigpu  # noqa: E402
from multigpu import messages  # noqa: E402


def _small_model(layers=2):
    inner = [keras.layers.Dense(4, name=f"dense_{i}") for i in range(layers - 1)]
    return keras.Sequential([keras.Input((3,)), *inner,
                             keras.layers.Dense(2, name="out")],
                            name=f"layers_{layers}")


def _message(fn, language="python", error=ValueError):
    with messages.language(language), pytest.raises(error) as caught:
        fn()
    return str(caught.value)


@pytest.mark.parametrize("gpus, python, r", [
    # R's gpus = "2" and gpus = factor(2) arrive as list("2").
    ("2", "'2' is a string, neither a device count nor a device name. ",
     '"2" is a string, neither a device count nor a device name. '),
    (["2"], "For 2 devices pass the number: gpus=2.",
     "For 2 devices pass the number: gpus = 2."),
    (["0", "1"], "['0', '1'] are strings, not GPU ids. ",
     'c("0", "1") are strings, not GPU ids. '),
    (["0", "1"], "Pass GPU ids as numbers: gpus=[0, 1].",
     "Pass GPU ids as numbers: gpus = c(0, 1)."),
    (True, "For every device pass gpus=None.",
     "For every device pass gpus = NULL."),
])
def test_numbers_in_disguise_get_the_number_as_the_fix(gpus, python, r):
    for language, part in (("python", python), ("r", r)):
        message = _message(lambda: multigpu.resolve_devices(gpus), language)
        assert part in message
        assert "single device" not in message and "For a single" not in message


def test_a_whole_float_count_is_told_to_be_an_int():
    message = _message(lambda: multigpu.resolve_devices(2.0))
    assert "A device count is an int, not the float 2.0. " in message
    assert message.endswith("Pass gpus=2.")


def test_a_numpy_vector_of_ids_or_names_is_a_list():
    names = np.array(["/cpu:0", "/cpu:2"])
    assert multigpu.resolve_devices(names) == ["/device:CPU:0", "/device:CPU:2"]
    message = _message(lambda: multigpu.resolve_devices(np.array([0, 1])))
    assert "GPU ids were given but this machine has no GPU." in message


def test_a_single_device_name_is_told_to_add_another():
    message = _message(lambda: multigpu.resolve_devices("/cpu:1"))
    assert "A single device name is not a device set." in message
    assert "Pass at least 2 names, e.g. ['/cpu:1', '/device:CPU:0']." in message
    message = _message(lambda: multigpu.resolve_devices("/gpu:7"))
    assert "Unknown device(s) ['/gpu:7']." in message


def test_model_parallel_of_one_layer_is_not_told_to_use_one_device():
    for devices in (2, None):
        message = _message(lambda devices=devices: multigpu.model_parallel(
            _small_model(1), devices=devices))
        assert "at most 1 devices" not in message
        assert ("Invalid `model`: 'layers_1' has 1 layer(s) ['out'], and model "
                "parallelism cuts a model between its layers") in message
        assert "multigpu.multi_gpu_model(model) (data parallelism)" in message


def test_model_parallel_with_more_devices_than_layers_names_the_count():
    message = _message(lambda: multigpu.model_parallel(_small_model(3),
                                                       devices=4), "r")
    assert message.endswith("Use at most 3 devices, e.g. devices = 3.")


def test_a_batch_smaller_than_microbatches_is_refused_in_every_call():
    partitioned = multigpu.model_parallel(_small_model(2), devices=2,
                                          microbatches=4)
    partitioned.compile(optimizer="sgd", loss="mse")
    x = np.zeros((8, 3), "float32")
    y = np.zeros((8, 2), "float32")
    calls = {
        "fit": lambda: partitioned.fit(x, y, batch_size=2, verbose=0),
        "evaluate": lambda: partitioned.evaluate(x, y, 2, verbose=0),
        "predict": lambda: partitioned.predict(x, batch_size=3, verbose=0),
    }
    for call in calls.values():
        message = _message(call)
        assert message.startswith("Invalid `batch_size`: received ")
        assert "pipelined with microbatches=4" in message
    message = _message(calls["fit"], "r")
    assert message == (
        "Invalid `batch_size`: received 2 for a model pipelined with "
        "microbatches = 4: each batch is cut into 4 micro-batches, so 2 of "
        "them would have no rows in every step. Use a batch_size of at least "
        "4, or build the model with model_parallel(model, microbatches = 2).")
    assert partitioned.predict(x, batch_size=4, verbose=0).shape == (8, 2)


@pytest.mark.parametrize("cache", ["memroy", "Memory", "memmory", "MEMORY"])
def test_a_cache_typo_of_memory_is_refused_before_files_are_named_after_it(
        cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = np.zeros((8, 3), "float32")
    with pytest.raises(ValueError) as caught:
        dataset = multigpu.distributed_dataset(x, x, 2, cache=cache)
        list(dataset)  # before the fix: writes <cache>.index and .data-*
    assert str(caught.value) == (
        f"Invalid `cache`: received '{cache}'; expected 'memory' or a file "
        "path prefix. Did you mean 'memory' (an in-memory cache)? For cache "
        f"files named '{cache}', give a path with a directory, e.g. "
        f"'./{cache}'.")
    assert os.listdir(tmp_path) == []


def test_cache_takes_what_the_docs_say(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = np.arange(8, dtype="float32")[:, None]
    for cache in (None, False, True, "memory", "./memroy", "cache_file"):
        dataset = multigpu.distributed_dataset(x, x, 2, cache=cache)
        assert sum(len(b[0]) for b in dataset) == 8
    assert sorted(os.listdir(tmp_path)) == [
        "cache_file.data-00000-of-00001", "cache_file.index",
        "memroy.data-00000-of-00001", "memroy.index"]
    for cache, part in (("", "received ''; expected None or False (no "
                             "cache), 'memory' or True (in memory), or a "
                             "file path prefix"),
                        (str(tmp_path), "which is a directory; the cache is "
                                        "a file path prefix")):
        with pytest.raises(ValueError, match=r"^Invalid `cache`: ") as caught:
            multigpu.distributed_dataset(x, x, 2, cache=cache)
        assert part in str(caught.value)


def test_shuffle_buffer_is_checked_without_shuffle():
    x = np.zeros((8, 3), "float32")
    with pytest.raises(ValueError, match=r"`shuffle_buffer`: received -5"):
        multigpu.distributed_dataset(x, x, 2, shuffle_buffer=-5)


@pytest.mark.parametrize("batch_size", [-1, 2.5, True, "a", None])
def test_batch_split_names_a_bad_batch_size(batch_size):
    parallel = multigpu.multi_gpu_model(_small_model(2), gpus=2)
    assert parallel.batch_split(np.int64(3)) == [("/device:CPU:0", 1),
                                                 ("/device:CPU:1", 2)]
    assert parallel.batch_split(0) == [("/device:CPU:0", 0), ("/device:CPU:1", 0)]
    assert parallel.batch_split(4.0) == [("/device:CPU:0", 2), ("/device:CPU:1", 2)]
    # Before: -1 gave [('/device:CPU:0', -1), ...], None a bare int() error.
    with pytest.raises(ValueError, match=r"^Invalid `batch_size`: received "
                       r".*; expected an int >= 0\.$"):
        parallel.batch_split(batch_size)


def test_executed_ops_and_save_model_name_a_wrong_first_argument(tmp_path):
    for fn in (None, 3):
        with pytest.raises(TypeError, match=r"^Invalid `fn`: received "
                           r"(None|3); expected a function"):
            multigpu.executed_ops(fn)
    with pytest.raises(TypeError, match=r"^Invalid `model`: received an object "
                       r"of type NoneType; expected a keras.Model"):
        multigpu.save_model(None, tmp_path / "m.keras")


def test_distributed_dataset_takes_a_list_of_arrays_and_names_a_scalar():
    x = np.arange(16, dtype="float32").reshape(8, 2)
    # Before: the list was stacked into one tensor of 2 rows, "Dimensions 2
    # and 8 are not compatible".
    dataset = multigpu.distributed_dataset([x, x[:, :1]], x[:, 0], 4)
    features, targets = next(iter(dataset))
    assert [f.shape.as_list() for f in features] == [[4, 2], [4, 1]]
    for kwargs, name, shown in (({"x": "abc", "y": x}, "x", "'abc'"),
                                ({"x": x, "y": 3}, "y", "3")):
        # Before: IndexError: tuple index out of range.
        with pytest.raises(ValueError, match=rf"^Invalid `{name}`: received "
                           rf"{shown}, which has no rows; expected numpy "
                           r"arrays"):
            multigpu.distributed_dataset(per_replica_batch_size=2, **kwargs)
