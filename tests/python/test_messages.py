"""Messages spell values and calls in the caller's language."""

import numpy as np
import pytest

from multigpu import messages


@pytest.mark.parametrize("value, python, r", [
    (None, "None", "NULL"),
    (True, "True", "TRUE"),
    (np.bool_(False), "False", "FALSE"),
    (2, "2", "2"),
    (np.int64(3), "3", "3"),
    (2.5, "2.5", "2.5"),
    (2.0, "2.0", "2"),
    (float("nan"), "nan", "NaN"),
    (float("-inf"), "-inf", "-Inf"),
    ("a\"b", "'a\"b'", '"a\\"b"'),
    ([0, 1], "[0, 1]", "c(0, 1)"),
    (["/gpu:0", "/gpu:1"], "['/gpu:0', '/gpu:1']", 'c("/gpu:0", "/gpu:1")'),
    ([0, "a"], "[0, 'a']", 'list(0, "a")'),
    ([None], "[None]", "list(NULL)"),
    ([3], "[3]", "list(3)"),
    (["/cpu:9"], "['/cpu:9']", 'list("/cpu:9")'),
    ({"a": 1}, "{'a': 1}", "list(a = 1)"),
])
def test_literal_in_each_language(value, python, r):
    assert messages.literal(value) == python
    with messages.language("r"):
        assert messages.literal(value) == r
    assert messages.literal(value) == python


def test_api_and_literals_follow_the_language():
    assert messages.api("virtual_devices", "n") == "multigpu.virtual_devices(n)"
    assert messages.literals([True, False]) == "True or False"
    token = messages.set_language("r")
    try:
        assert messages.api("virtual_devices", "n") == "virtual_devices(n)"
        assert messages.literals([None, 1, "x"]) == 'NULL, 1, or "x"'
    finally:
        messages.reset_language(token)
    assert messages.current_language() == "python"


def test_unknown_language_is_refused_naming_it():
    with pytest.raises(ValueError, match="received 'julia'"):
        with messages.language("julia"):
            pass


def test_setting_writes_an_argument_in_each_language():
    assert messages.setting("engine", "mirrored") == "engine='mirrored'"
    assert messages.setting("cpu_merge", True) == "cpu_merge=True"
    with messages.language("r"):
        assert messages.setting("engine", "mirrored") == 'engine = "mirrored"'
        assert messages.setting("gpus", ["/cpu:0", "/cpu:1"]) == 'gpus = c("/cpu:0", "/cpu:1")'


def test_hints_about_data_read_in_each_language():
    # Hints that name a setting of the user's data pipeline (tf.data's
    # drop_remainder, fit's shuffle, Keras's padding layers) follow the
    # caller's language like the values they quote.
    from multigpu import inputs
    from multigpu.distribute import fit as distributed
    from support.scenario_files import speaks

    def hints():
        return [str(inputs.no_batch_error("x", "fit")),
                str(inputs.data._ragged_error("x")),
                str(distributed._no_batches_error("it is empty"))]

    python = hints()
    with messages.language("r"):
        r = hints()
    assert all("drop_remainder=True" in h for h in python[::2])
    assert all("drop_remainder = TRUE" in h for h in r[::2])
    assert "layer_embedding(mask_zero = TRUE)" in r[1]
    assert all(speaks("python", h) for h in python)
    assert all(speaks("r", h) and "=True" not in h for h in r)


def test_r_integer_na_reads_na_in_r_only():
    value = np.int32(messages.R_NA_INTEGER)
    with messages.language("r"):
        assert messages.literal(value) == "NA"
        assert messages.literal([1, value]) == "c(1, NA)"
    assert messages.literal(value) == "-2147483648"
