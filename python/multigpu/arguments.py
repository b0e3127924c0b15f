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
