"""multigpu: multi-device Keras training in one call.

`multi_gpu_model` replicates a model on several devices and splits every
batch between them; `virtual_devices` simulates several devices on one.
"""

try:
    import tensorflow  # noqa: F401
except ModuleNotFoundError as error:
    if error.name != "tensorflow":
        raise
    # TensorFlow comes from an extra (its CPU and GPU builds are different
    # distributions of one import): say which, as Keras does for a backend.
    raise ModuleNotFoundError(
        "multigpu needs TensorFlow 2.21, which is not installed in this "
        "Python. Install multigpu with the extra for your hardware: "
        "`pip install \"multigpu[cpu]\"` (CPU only) or "
        "`pip install \"multigpu[gpu]\"` (NVIDIA GPUs, Linux); from a "
        "checkout, `pip install -e \".[cpu]\"` or `pip install -e \".[gpu]\"`.",
        name="tensorflow",
    ) from error

from multigpu.devices import available_devices
from multigpu.devices import canonical_device_name
from multigpu.devices import resolve_devices
from multigpu.devices import virtual_devices
from multigpu.placement import executed_ops
from multigpu.placement import placement_report
from multigpu.model_parallel import PartitionedModel
from multigpu.model_parallel import model_parallel
from multigpu.replicas import DataParallel
from multigpu.replicas import ParallelModel
from multigpu.replicas import multi_gpu_model
from multigpu.saving import load_model
from multigpu.saving import save_model
from multigpu.strategy import mirrored_strategy
from multigpu.strategy import multi_worker_strategy
from multigpu.strategy import StrategyUsageError
from multigpu.data import distributed_dataset
from multigpu.checkpoints import checkpoint_callbacks
from multigpu.checkpoints import make_or_restore_model
from multigpu.distributed import fit_distributed
from multigpu.mirrored import MirroredModel

__version__ = "0.1.0"
