"""Observing where TensorFlow really keeps weights and runs the ops of a step.

Device scopes are requests; the placer decides. This package reads the
partition graphs TensorFlow executed (run metadata), one per device, so tests
and reports state what ran where rather than what was asked for, and the
profiler's trace for how long each device's ops took.

On the JAX backend a step is one program XLA compiles for its devices:
the report compiles the model's step on the batch and reads that program
(`xla`, `hlo`) instead.

The modules, lowest level first: `traffic` (transfers between devices and
their totals, on every backend), `arguments` (the calls' arguments
checked), `graphs` (graph capture: executed nodes,
ops and weights per device), `profiler` (the profiler's trace parsed into
time per node and device), `step` (one observed step, the model restored
after it), `hlo` (a compiled XLA program's text: row slices, collectives,
instructions), `xla` (the JAX step compiled and read), `table` (the
report's rows and text) and `report` (`placement_report`).
"""

import importlib

from multigpu.devices import HOST_DEVICE
from multigpu.placement.report import placement_report
from multigpu.placement.table import PlacementReport, format_bytes
from multigpu.placement.traffic import gradient_bytes

# TensorFlow's observations (run metadata, the profiler, one observed
# step), imported on first use: the report on JAX, and `format_bytes` for
# the plots and the memory plan, need no TensorFlow.
_TENSORFLOW_PARTS = {
    "PLUMBING_OPS": "graphs",
    "ExecutedNode": "graphs",
    "executed_node_defs": "graphs",
    "executed_nodes": "graphs",
    "executed_ops": "graphs",
    "ops_by_device": "graphs",
    "variables_by_device": "graphs",
    "op_seconds": "profiler",
    "step_traffic": "step",
}

__all__ = [
    "HOST_DEVICE",
    "PLUMBING_OPS",
    "ExecutedNode",
    "PlacementReport",
    "executed_node_defs",
    "executed_nodes",
    "executed_ops",
    "format_bytes",
    "gradient_bytes",
    "op_seconds",
    "ops_by_device",
    "placement_report",
    "step_traffic",
    "variables_by_device",
]


def __getattr__(name):
    """TensorFlow's observations (`_TENSORFLOW_PARTS`), imported on first use."""
    if name in _TENSORFLOW_PARTS:
        module = importlib.import_module(
            f"multigpu.placement.{_TENSORFLOW_PARTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
