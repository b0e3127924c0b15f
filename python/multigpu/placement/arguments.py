"""The arguments of `placement_report` and `step_traffic`, checked.

Shared by the TensorFlow report (`step`) and the JAX one (`xla`); imports
no backend.
"""

import keras

from multigpu import inputs
from multigpu.arguments import check_flag
from multigpu.messages import literal, setting


def check_report_args(model, x, y, print_table):
    """Checks `placement_report`'s (and `step_traffic`'s) arguments.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ValueError: for `y` without `x`, rows `x` cannot give, or a
            non-bool `print_table`.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `model`: received an object of type "
            f"{type(model).__name__}; expected a keras.Model."
        )
    if x is None and y is not None:
        raise ValueError(
            f"Invalid `x`: received {literal(None)} with targets `y`; a training step "
            "needs inputs. Pass x (and y) for one batch."
        )
    if x is not None:
        inputs.check_rows("x", x, "placement_report")
    check_flag("print_table", print_table)


def check_trainable(model):
    """Refuses targets for a model that has no training step.

    Raises:
        ValueError: if `model` is not compiled.
    """
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"Invalid `y`: received targets, but model {literal(model.name)} is not "
            "compiled, so it has no training step. Call model.compile(...) "
            f"first, or pass {setting('y', None)} to observe a prediction step."
        )
