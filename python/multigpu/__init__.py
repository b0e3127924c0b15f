"""multigpu: multi-device Keras training in one call.

`multi_gpu_model` replicates a model on several devices and splits every
batch between them; `virtual_devices` simulates several devices on one.
"""

from multigpu.devices import available_devices
from multigpu.devices import canonical_device_name
from multigpu.devices import resolve_devices
from multigpu.devices import virtual_devices
from multigpu.placement import executed_ops
from multigpu.replicas import DataParallel
from multigpu.replicas import ParallelModel
from multigpu.replicas import multi_gpu_model

__version__ = "0.1.0"
