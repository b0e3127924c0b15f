"""The devices of the JAX engine as a mesh, and where arrays live on it.

The engine's devices form a 1-D `jax.sharding.Mesh` whose one axis,
`BATCH_AXIS`, holds them all. The template's variables, and every value a
step returns, are replicated on it (`replicated`); inside a compiled step a
batch is constrained to be split along it (`split_batch`), and XLA's
partitioner gives each device its share of the rows, an uneven share when
the rows do not divide (a batch of 10 on 4 devices: 3, 3, 3 and 1 rows),
with its reductions (loss, metrics, gradients, BatchNormalization's
moments) over the real rows only. A batch reaches the step already split
when its rows divide (`put_batch`), and whole on every device otherwise;
the step's state stays whole on every device (`keep_replicated`), so one
compiled step serves every epoch.
"""

import jax
import numpy as np

from multigpu.engines.jax import processes
from multigpu.runtime import jax as jax_runtime

BATCH_AXIS = "batch"


def device_mesh(devices):
    """A 1-D mesh over `devices`, its one axis named `BATCH_AXIS`.

    Args:
        devices: Canonical device names (`multigpu.resolve_devices`).

    Returns:
        A `jax.sharding.Mesh`.

    Raises:
        ValueError: when the devices leave a process of a job of several
            out (`processes.check_devices_span_processes`).

    Example:
    >>> device_mesh(["/device:CPU:0", "/device:CPU:1"]).shape
    {'batch': 2}
    """
    found = [jax_runtime.device(d) for d in devices]
    processes.check_devices_span_processes(devices, found)
    return jax.sharding.Mesh(np.array(found), (BATCH_AXIS,))


def replicated(mesh):
    """The sharding that holds a whole copy of an array on every device."""
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def split_rows(mesh):
    """The sharding that splits an array's first axis across the devices."""
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(BATCH_AXIS))


def is_traced(value):
    """Whether `value` is an array being traced into a compiled function."""
    return isinstance(value, jax.core.Tracer)


def split_batch(tree, mesh):
    """Constrains every batched array of `tree` to be split along the rows.

    Inside a compiled step the constraint tells XLA's partitioner to give
    each device its share of the rows; outside one (an eager call) nothing
    is constrained, and the arrays stay as they are.

    Args:
        tree: A structure of arrays whose first axis is the batch (scalars
            and None pass through).
        mesh: The engine's `device_mesh`.

    Returns:
        `tree`, constrained.
    """
    sharding = split_rows(mesh)

    def constrain(value):
        if is_traced(value) and value.ndim >= 1:
            return jax.lax.with_sharding_constraint(value, sharding)
        return value

    return jax.tree.map(constrain, tree)


def gather(tree, mesh):
    """Constrains every array of `tree` to be whole on every device.

    What a compiled step returns (logs, the new state, predictions) must be
    so: a split of rows that do not divide evenly, or XLA's own choice of
    sharding for a value, has no `jax.Array` layout outside the step.
    """
    sharding = replicated(mesh)

    def constrain(value):
        if is_traced(value):
            return jax.lax.with_sharding_constraint(value, sharding)
        return value

    return jax.tree.map(constrain, tree)


def put_replicated(tree, mesh):
    """Places every array of `tree` whole on every device of `mesh`.

    A batch handed to a compiled step so is split there, by the step's
    constraint, without another transfer; left uncommitted, XLA would
    choose the batch's sharding itself, possibly one that `jax.Array`
    cannot express (a split over two of four devices).
    """
    sharding = replicated(mesh)
    return jax.tree.map(
        lambda value: value if value is None else jax.device_put(value, sharding),
        tree)


def put_batch(tree, mesh):
    """Places a batch for a compiled step: split where its rows divide.

    An array whose rows divide evenly between the devices is split along
    them, each device receiving only its rows, as the step's constraint
    splits it; any other array (a batch of 10 rows on 4 devices, say) is
    placed whole on every device (`put_replicated`), and the step splits it
    unevenly. Both placements are ones a `jax.Array` can express.

    Args:
        tree: A structure of arrays whose first axis is the batch (None
            passes through).
        mesh: The engine's `device_mesh`.

    Returns:
        `tree`, its arrays placed on the devices of `mesh`.

    Example:
    >>> x, y = put_batch((np.ones((8, 3)), np.ones((8,))), mesh)  # 4 devices
    >>> x.sharding.shard_shape(x.shape)
    (2, 3)
    """
    split, whole = split_rows(mesh), replicated(mesh)
    count = mesh.devices.size
    leaves, structure = jax.tree.flatten(tree)
    shardings = [split if np.ndim(value) >= 1 and np.shape(value)[0] % count == 0
                 else whole for value in leaves]
    if jax_runtime.is_joined():
        return jax.tree.unflatten(structure,
                                  processes.put_global(leaves, shardings))
    # One transfer call for every array of the batch.
    return jax.tree.unflatten(structure, jax.device_put(leaves, shardings))


def keep_replicated(tree, mesh):
    """Places on every device the arrays of `tree` that are not there yet.

    A compiled step is compiled for the placement of its arguments: a state
    whose metrics were reset (placed on one device) would compile the step
    again. The arrays already whole on every device, the usual case, are
    passed on untouched, with no transfer.

    Args:
        tree: A structure of arrays (a step's state).
        mesh: The engine's `device_mesh`.

    Returns:
        `tree`, each array whole on every device of `mesh`.
    """
    sharding = replicated(mesh)
    leaves, structure = jax.tree.flatten(tree)
    stray = [i for i, value in enumerate(leaves)
             if getattr(value, "sharding", None) != sharding]
    if stray:
        # One transfer call for all of them (a reset's metrics, say).
        placed = jax.device_put([leaves[i] for i in stray], sharding)
        for i, value in zip(stray, placed, strict=True):
            leaves[i] = value
    return jax.tree.unflatten(structure, leaves)


def replicate_variables(variables, mesh):
    """Assigns each Keras variable its value, replicated on `mesh`.

    In a job of several processes, process 0's value
    (`processes.from_process_0`).

    Args:
        variables: Keras variables (the template's).
        mesh: The engine's `device_mesh`.
    """
    sharding = replicated(mesh)
    variables = list(variables)
    if jax_runtime.is_joined():
        values = processes.from_process_0([v.value for v in variables], sharding)
    else:
        values = [jax.device_put(v.value, sharding) for v in variables]
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)
