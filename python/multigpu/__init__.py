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

from multigpu import backends
from multigpu.checkpoints import checkpoint_callbacks, make_or_restore_model
from multigpu.devices import (
    available_devices,
    canonical_device_name,
    resolve_devices,
    virtual_devices,
)
from multigpu.distribute.datasets import distributed_dataset
from multigpu.distribute.fit import fit_distributed
from multigpu.distribute.strategy import (
    StrategyUsageError,
    mirrored_strategy,
    multi_worker_strategy,
)
from multigpu.engines.front import multi_gpu_model
from multigpu.insight.equivalence import EquivalenceReport, check_equivalence
from multigpu.insight.memory_plan import MemoryPlan, find_batch_size, memory_plan
from multigpu.insight.monitor import ScalingMonitor
from multigpu.insight.plotting import plot_placement
from multigpu.partition.model_parallel import PartitionedModel, model_parallel
from multigpu.placement import executed_ops, placement_report
from multigpu.saving import load_model, save_model
from multigpu.step.nonfinite import NonFiniteInputError

__version__ = "0.1.0"

# The TensorFlow engines' classes, imported where Keras runs on TensorFlow
# (their Keras registrations load saved parallel models) and on first use
# elsewhere: on JAX, importing multigpu builds no TensorFlow engine.
_TENSORFLOW_ENGINE_CLASSES = {
    "DataParallelReplicas": "multigpu.engines.tensorflow.replicate",
    "MirroredModel": "multigpu.engines.tensorflow.mirrored",
    "ParallelModel": "multigpu.engines.tensorflow.replicate",
}

if backends.current() == "tensorflow":
    from multigpu.engines.tensorflow.mirrored import MirroredModel
    from multigpu.engines.tensorflow.replicate import (
        DataParallelReplicas,
        ParallelModel,
    )

__all__ = [
    "DataParallelReplicas",
    "EquivalenceReport",
    "MemoryPlan",
    "MirroredModel",
    "NonFiniteInputError",
    "ParallelModel",
    "PartitionedModel",
    "ScalingMonitor",
    "StrategyUsageError",
    "available_devices",
    "canonical_device_name",
    "check_equivalence",
    "checkpoint_callbacks",
    "distributed_dataset",
    "executed_ops",
    "find_batch_size",
    "fit_distributed",
    "load_model",
    "make_or_restore_model",
    "memory_plan",
    "mirrored_strategy",
    "model_parallel",
    "multi_gpu_model",
    "multi_worker_strategy",
    "placement_report",
    "plot_placement",
    "resolve_devices",
    "save_model",
    "virtual_devices",
]


def __getattr__(name):
    """The TensorFlow engines' classes on first use, and a former name.

    `multigpu.DataParallel`, the layer's former name, warns: it shadowed
    `keras.distribution.DataParallel` for users importing both.
    """
    if name in _TENSORFLOW_ENGINE_CLASSES:
        import importlib

        module = importlib.import_module(_TENSORFLOW_ENGINE_CLASSES[name])
        return getattr(module, name)
    if name == "DataParallel":
        import warnings

        warnings.warn(
            "multigpu.DataParallel is deprecated: the layer is now "
            "multigpu.DataParallelReplicas (the old name shadowed "
            "keras.distribution.DataParallel). Use "
            "multigpu.DataParallelReplicas.",
            DeprecationWarning, stacklevel=2,
        )
        return __getattr__("DataParallelReplicas")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
