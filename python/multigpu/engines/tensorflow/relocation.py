"""`cpu_relocation`: a model's weights rebuilt on the host CPU (TensorFlow).

Placing variables is the backend's business: TensorFlow places a variable
on the device scope (`tf.device`) it is created in.
"""

import tensorflow as tf

from multigpu.devices import HOST_DEVICE
from multigpu.engines.copies import check_copy, copy_model
from multigpu.messages import literal, setting


def relocate_to_cpu(model):
    """Rebuilds `model` with its variables on the CPU, keeping its weights.

    The weights are copied over, not re-created: re-created weights would
    lose what the model has learned (keras-team/keras#11313). The copy is
    `copies.copy_model`'s: a KerasHub task stays a task of its class, a
    `Lambda` layer of this session is kept as it is, and an adapted
    preprocessing layer keeps its state. A copy that computes otherwise
    (state no hand-over carries) is refused (`copies.check_copy`).

    Args:
        model: A built Keras model.

    Returns:
        A copy of `model` whose variables live on the host CPU, with its
        weights and state.

    Raises:
        ValueError: if the model cannot be copied, or its copy computes
            otherwise; the message names `cpu_relocation` and the fix.

    Example:
    >>> on_cpu = relocate_to_cpu(model)
    >>> on_cpu.weights[0].device
    '/job:localhost/replica:0/task:0/device:CPU:0'
    """
    fix = (f"Build the model under tf.device('/cpu:0') instead and keep "
           f"{setting('cpu_relocation', False)}.")
    try:
        with tf.device(HOST_DEVICE):
            clone = copy_model(model)
    except ValueError as error:
        raise ValueError(
            f"Invalid `model` for {setting('cpu_relocation', True)}: {literal(model.name)} cannot "
            f"be cloned ({error}). {fix}") from None
    clone.set_weights(model.get_weights())
    check_copy(model, clone, fix=fix, invalid=(
        f"Invalid `model` for {setting('cpu_relocation', True)}"))
    return clone
