"""Where a variable lives and how many bytes it holds.

One answer for every report and check of the package: a Keras variable, a
TensorFlow variable, or a variable mirrored over several devices by a
`tf.distribute` strategy (one component per device).
"""

import numpy as np
import tensorflow as tf

from multigpu.devices import canonical_device_name, short_device_name


def variable_components(variable):
    """The per-device TensorFlow variables behind a Keras or TF variable.

    A variable created under a `tf.distribute` strategy (a MirroredVariable)
    has one component per device; any other variable has one.

    Returns:
        A list of `(device, variable)` pairs, devices as `"/device:TYPE:N"`.
    """
    handle = getattr(variable, "value", variable)
    if isinstance(handle, tf.distribute.DistributedValues):
        parts = list(handle.values)
    else:
        parts = [handle]
    return [(short_device_name(part.device), part) for part in parts]


def variable_device(variable):
    """Canonical device of a Keras or TensorFlow variable.

    Example:
    >>> with tf.device("/cpu:1"):
    ...     layer.build((None, 4))
    >>> variable_device(layer.kernel)
    '/device:CPU:1'
    """
    handle = getattr(variable, "value", variable)
    return canonical_device_name(short_device_name(handle.device))


def variable_bytes(variable):
    """Bytes of one variable's value (of one component, if mirrored).

    Example:
    >>> variable_bytes(keras.Variable(np.zeros((3, 4), "float32")))
    48
    """
    return int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size
