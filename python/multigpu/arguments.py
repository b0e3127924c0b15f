"""Checks of user arguments shared by the package's public functions.

Each check accepts what a user may reasonably pass (NumPy scalars from an
array, R's logicals through reticulate) and refuses anything else with a
`ValueError` naming the argument, the value and what is expected.
"""

import numpy as np

from multigpu.messages import literal, literals


def check_flag(name, value):
    """`value` as a Python bool; NumPy bools are accepted.

    Args:
        name: The argument's name, for the message.
        value: What the user passed.

    Returns:
        `True` or `False`.

    Raises:
        ValueError: if `value` is not a bool or a NumPy bool.

    Example:
    >>> check_flag("cpu_merge", np.bool_(True))
    True
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(
        f"Invalid `{name}`: received {literal(value)}; expected "
        f"{literals([True, False])}."
    )


def is_int(value):
    """Whether `value` is an integer: a Python int or a NumPy integer scalar.

    Bools are not integers here (`True` is no device count), though Python
    counts them as such.

    Example:
    >>> is_int(np.int64(2)), is_int(True), is_int(2.0)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool) or (
        hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0
        and value.dtype.kind in "iu"
    )


def check_int(name, value, minimum, expected=None):
    """`value` as a Python int of at least `minimum`; NumPy integers accepted.

    Args:
        name: The argument's name, for the message.
        value: What the user passed.
        minimum: The smallest value accepted.
        expected: What the message says is expected, when more than
            "an int >= minimum" (what the number means, other values the
            argument accepts).

    Returns:
        `int(value)`.

    Raises:
        ValueError: if `value` is not an integer (bools are not) or is
            below `minimum`.

    Example:
    >>> check_int("microbatches", np.int32(2), 1)
    2
    """
    if is_int(value) and int(value) >= minimum:
        return int(value)
    raise ValueError(
        f"Invalid `{name}`: received {literal(value)}; expected "
        f"{expected or f'an int >= {minimum}'}."
    )
