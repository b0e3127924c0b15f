"""Values and function names in user-facing messages, in the caller's language.

The core's errors and warnings are read by Python users and, through the R
package, by R users. A message names the value it received and the fix; both
must read in the user's language: `None`/`True`/`['/gpu:0', '/gpu:1']` and
`multigpu.virtual_devices(n)` for Python, `NULL`/`TRUE`/`c("/gpu:0",
"/gpu:1")` and `virtual_devices(n)` for R. Messages are written once, with
`literal()` for every value, `setting()` for an argument set to a value
(`engine='mirrored'` / `engine = "mirrored"`) and `api()` for every
function a user calls; the
R package runs each call to the core inside `language("r")`, so the same
message is rendered in R there.

Example:
>>> f"Invalid `gpus`: received {literal([0, 1])}; expected {literal(None)}."
'Invalid `gpus`: received [0, 1]; expected None.'
>>> with language("r"):
...     f"Invalid `gpus`: received {literal([0, 1])}; expected {literal(None)}."
'Invalid `gpus`: received c(0, 1); expected NULL.'
"""

import contextlib
import contextvars
import math
import numbers

import numpy as np

LANGUAGES = ("python", "r")

_language = contextvars.ContextVar("multigpu_message_language",
                                   default="python")


# R's NA in an integer vector, as Python receives it (an int32).
R_NA_INTEGER = -(2**31)


def current_language():
    """The language messages are rendered in now: `"python"` or `"r"`."""
    return _language.get()


@contextlib.contextmanager
def language(name):
    """Renders messages created in this block in language `name`.

    Args:
        name: `"python"` or `"r"`.

    Raises:
        ValueError: for any other name.

    Example:
    >>> with language("r"):
    ...     literal(True)
    'TRUE'
    """
    if name not in LANGUAGES:
        raise ValueError(
            f"Invalid `name`: received {name!r}; expected one of "
            f"{', '.join(repr(n) for n in LANGUAGES)}."
        )
    token = _language.set(name)
    try:
        yield
    finally:
        _language.reset(token)


def set_language(name):
    """Sets the language for the current context; returns a reset token.

    For callers that cannot use a `with` block (the R bridge enters and
    leaves around each call). Pass the token to `reset_language`.
    """
    if name not in LANGUAGES:
        raise ValueError(
            f"Invalid `name`: received {name!r}; expected one of "
            f"{', '.join(repr(n) for n in LANGUAGES)}."
        )
    return _language.set(name)


def reset_language(token):
    """Restores the language that was in force before `set_language`."""
    _language.reset(token)


def literal(value):
    """`value` as the current language writes it.

    Python: `repr(value)`, NumPy scalars as the Python value they hold. R:
    `NULL`, `TRUE`/`FALSE`, `NA`, `NaN`, `Inf`, numbers without an `L`,
    strings in double quotes, a list of two or more scalars of one kind as
    `c(...)`, anything else in a list as `list(...)`, a dict as `list(name = ...)`.

    Args:
        value: Any value.

    Returns:
        A string.

    Example:
    >>> literal(["/gpu:0", "/gpu:1"])
    "['/gpu:0', '/gpu:1']"
    """
    value = _plain(value)
    if current_language() == "r":
        return _r_literal(value)
    return repr(value)


def literals(values, conjunction="or"):
    """Several literals joined for prose: `True or False`, `TRUE or FALSE`.

    Example:
    >>> literals([True, False])
    'True or False'
    """
    rendered = [literal(v) for v in values]
    if len(rendered) <= 2:
        return f" {conjunction} ".join(rendered)
    return ", ".join(rendered[:-1]) + f", {conjunction} " + rendered[-1]


def setting(name, value):
    """An argument set to a value, as the current language writes it.

    Python: `engine='mirrored'`; R: `engine = "mirrored"`.

    Example:
    >>> setting("cpu_merge", False)
    'cpu_merge=False'
    """
    if current_language() == "r":
        return f"{name} = {literal(value)}"
    return f"{name}={literal(value)}"


def api(function, arguments=""):
    """How a user calls the package's function `function` in this language.

    Python: `multigpu.virtual_devices(n)`; R: `virtual_devices(n)` (the R
    package exports the same names).

    Args:
        function: The function's name, e.g. `"virtual_devices"`.
        arguments: What goes between the parentheses, e.g. `"n"`.

    Example:
    >>> api("virtual_devices", "4")
    'multigpu.virtual_devices(4)'
    """
    prefix = "" if current_language() == "r" else "multigpu."
    return f"{prefix}{function}({arguments})"


def _plain(value):
    """NumPy scalars and arrays as the Python values they hold."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _r_scalar(value):
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, numbers.Integral):
        # No R integer is -2^31: it is how R stores NA in an integer vector.
        return "NA" if int(value) == R_NA_INTEGER else str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Inf" if value > 0 else "-Inf"
        return repr(value).removesuffix(".0") if value.is_integer() else repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    return None


def _r_literal(value):
    scalar = _r_scalar(value)
    if scalar is not None:
        return scalar
    if isinstance(value, dict):
        items = ", ".join(f"{k} = {_r_literal(_plain(v))}" for k, v in value.items())
        return f"list({items})"
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        kinds = {_r_kind(v) for v in items}
        # One element stays a list: in R, c(3) is the number 3.
        if len(items) >= 2 and len(kinds) == 1 and None not in kinds:
            return "c(" + ", ".join(_r_scalar(v) for v in items) + ")"
        return "list(" + ", ".join(_r_literal(v) for v in items) + ")"
    return f"<{type(value).__name__}>"


def _r_kind(value):
    """The R vector type a scalar belongs in, or None if not an atomic scalar."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "logical"
    if isinstance(value, numbers.Real):
        return "numeric"
    if isinstance(value, str):
        return "character"
    return None
