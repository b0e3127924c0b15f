"""Observing where TensorFlow really keeps weights and runs the ops of a step.

Device scopes are requests; the placer decides. This package reads the
partition graphs TensorFlow executed (run metadata), one per device, so tests
and reports state what ran where rather than what was asked for, and the
profiler's trace for how long each device's ops took.

On the JAX backend a step is one program XLA compiles for its devices:
the report compiles the model's step on the batch and reads that program
(`xla`, `hlo`) instead.

The modules, lowest level first: `graphs` (graph capture: executed nodes,
ops and weights per device), `profiler` (the profiler's trace parsed into
time per node and device), `step` (one observed step, the model restored
after it), `hlo` (a compiled XLA program's text: row slices, collectives,
instructions), `xla` (the JAX step compiled and read), `table` (the
report's rows and text) and `report` (`placement_report`).
"""

from multigpu.devices import HOST_DEVICE
from multigpu.placement.graphs import (
    PLUMBING_OPS,
    ExecutedNode,
    executed_node_defs,
    executed_nodes,
    executed_ops,
    gradient_bytes,
    ops_by_device,
    variables_by_device,
)
from multigpu.placement.profiler import op_seconds
from multigpu.placement.report import placement_report
from multigpu.placement.step import step_traffic
from multigpu.placement.table import PlacementReport, format_bytes

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
