"""Where a variable lives and how many bytes it holds.

One answer for every report and check of the package: a Keras variable, a
TensorFlow variable, a variable mirrored over several devices by a
`tf.distribute` strategy (one component per device), or on JAX an array
replicated or sharded over devices. The backend's runtime
(`multigpu.runtime`) says where the parts of a value are.
"""

import keras
import ml_dtypes
import numpy as np

from multigpu import runtime
from multigpu.devices import canonical_device_name, short_device_name


def variable_components(variable):
    """The per-device values behind a Keras, TensorFlow or JAX variable.

    A variable created under a `tf.distribute` strategy (a MirroredVariable)
    has one component per device, as has a JAX array replicated on several;
    any other variable has one.

    Returns:
        A list of `(device, value)` pairs, devices as `"/device:TYPE:N"`.
    """
    handle = getattr(variable, "value", variable)
    return [(short_device_name(device), part) for device, part
            in runtime.of_backend().variable_components(handle)]


def variable_device(variable):
    """Canonical device of a Keras or TensorFlow variable (its first part's).

    Example:
    >>> with tf.device("/cpu:1"):
    ...     layer.build((None, 4))
    >>> variable_device(layer.kernel)
    '/device:CPU:1'
    """
    return canonical_device_name(variable_components(variable)[0][0])


def variable_bytes(variable):
    """Bytes of one variable's value (of one component, if mirrored).

    Example:
    >>> variable_bytes(keras.Variable(np.zeros((3, 4), "float32")))
    48
    """
    dtype = keras.backend.standardize_dtype(variable.dtype)
    # NumPy has no bfloat16 or float8 of its own: ml_dtypes (a Keras
    # dependency) defines them.
    itemsize = np.dtype(getattr(ml_dtypes, dtype, dtype)).itemsize
    return int(np.prod(variable.shape)) * itemsize
