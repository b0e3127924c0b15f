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
