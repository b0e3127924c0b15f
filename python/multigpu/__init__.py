"""multigpu: multi-device Keras training in one call.

`multi_gpu_model` replicates a model on several devices and splits every
batch between them; `virtual_devices` simulates several devices on one.
"""

# Keras imports TensorFlow when it runs on it (its default backend); on JAX
# it needs none, and neither does this package's JAX path.
try:
    from multigpu import backends
except ModuleNotFoundError as error:
    if (error.name or "").split(".")[0] != "tensorflow":
        raise
    # TensorFlow comes from an extra (its CPU and GPU builds are different
    # distributions of one import): say which, as Keras does for a backend.
    raise ModuleNotFoundError(
        "multigpu needs TensorFlow 2.21, which is not installed in this "
        "Python, on Keras's TensorFlow backend. Install multigpu with the "
        "extra for your hardware: `pip install \"multigpu[cpu]\"` (CPU only) "
        "or `pip install \"multigpu[gpu]\"` (NVIDIA GPUs, Linux); from a "
        "checkout, `pip install -e \".[cpu]\"` or `pip install -e \".[gpu]\"`. "
        "To train on JAX without TensorFlow, `pip install \"multigpu[jax]\"` "
        "and set KERAS_BACKEND=jax before Keras is imported.",
        name="tensorflow",
    ) from error

if backends.is_jax():
    # A job of several processes (the launcher's workers, a Slurm step's
    # tasks) joins before JAX's first computation, the only time JAX can.
    from multigpu.engines.jax.processes import join as _join_processes

    _join_processes()
from multigpu.checkpoints import checkpoint_callbacks, make_or_restore_model
from multigpu.devices import (
    available_devices,
    canonical_device_name,
    resolve_devices,
    virtual_devices,
)
from multigpu.engines.front import multi_gpu_model
from multigpu.insight.equivalence import EquivalenceReport, check_equivalence
from multigpu.insight.memory_plan import MemoryPlan, find_batch_size, memory_plan
from multigpu.insight.monitor import ScalingMonitor
from multigpu.insight.plotting import plot_placement
from multigpu.partition.front import model_parallel
from multigpu.placement import placement_report
from multigpu.saving import load_model, save_model
from multigpu.step.nonfinite import NonFiniteInputError

__version__ = "0.1.0"

# What runs on TensorFlow only: imported where Keras runs on TensorFlow
# (the engines' Keras registrations load saved parallel models) and on
# first use elsewhere, so that on JAX importing multigpu imports no
# TensorFlow and builds no TensorFlow engine. Where TensorFlow cannot be
# imported, each name is a stand-in whose call says how to install it
# (`backends.tensorflow_missing`).
_TENSORFLOW_ONLY = {
    "DataParallelReplicas": "multigpu.engines.tensorflow.replicate",
    "MirroredModel": "multigpu.engines.tensorflow.mirrored",
    "ParallelModel": "multigpu.engines.tensorflow.replicate",
    "PartitionedModel": "multigpu.partition.model_parallel",
    "StrategyUsageError": "multigpu.distribute.strategy",
    "distributed_dataset": "multigpu.distribute.datasets",
    "executed_ops": "multigpu.placement.graphs",
    "fit_distributed": "multigpu.distribute.fit",
    "mirrored_strategy": "multigpu.distribute.strategy",
    "multi_worker_strategy": "multigpu.distribute.strategy",
}

if backends.current() == "tensorflow":
    from multigpu.distribute.datasets import distributed_dataset
    from multigpu.distribute.fit import fit_distributed
    from multigpu.distribute.strategy import (
        StrategyUsageError,
        mirrored_strategy,
        multi_worker_strategy,
    )
    from multigpu.engines.tensorflow.mirrored import MirroredModel
    from multigpu.engines.tensorflow.replicate import (
        DataParallelReplicas,
        ParallelModel,
    )
    from multigpu.partition.model_parallel import PartitionedModel
    from multigpu.placement.graphs import executed_ops

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


def _stand_in(name):
    """What `name` is where TensorFlow cannot be imported: its use raises.

    A class for the classes (an exception class for `StrategyUsageError`,
    so that `except` clauses naming it still work), a function otherwise;
    making or calling it raises `backends.tensorflow_missing`.
    """

    def refuse(*args, **kwargs):
        raise backends.tensorflow_missing(name, written=(
            f"multigpu.{name}" if name[0].isupper() else None))

    if not name[0].isupper():
        refuse.__name__ = refuse.__qualname__ = name
        return refuse
    bases = (RuntimeError,) if name.endswith("Error") else ()
    return type(name, bases, {
        "__new__": lambda cls, *args, **kwargs: refuse(),
        "__doc__": f"multigpu.{name}: needs TensorFlow, not installed here.",
        "__module__": __name__,
    })


def __getattr__(name):
    """What runs on TensorFlow only, on first use; and a former name.

    `multigpu.DataParallel`, the layer's former name, warns: it shadowed
    `keras.distribution.DataParallel` for users importing both.
    """
    if name in _TENSORFLOW_ONLY:
        import importlib

        try:
            module = importlib.import_module(_TENSORFLOW_ONLY[name])
        except ModuleNotFoundError as error:
            if (error.name or "").split(".")[0] != "tensorflow":
                raise
            value = _stand_in(name)
        else:
            value = getattr(module, name)
        globals()[name] = value
        return value
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
