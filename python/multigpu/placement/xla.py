"""`placement_report` on the JAX backend: read from the step XLA compiled.

On JAX a step is one program that XLA compiles for its devices: the SPMD
partitioner splits it (`num_partitions`), and every device runs the same
partitioned program on its share. So the report does not run the step: it
compiles the model's step on the caller's batch as Keras's `fit` does
(`jax.jit(model.train_step)`, or `predict_step`, lowered on the model's
state and the batch, `.lower(...).compile()`) and reads what XLA made of
it (`multigpu.placement.hlo`):

- rows: the slice of the batch each device takes inside the program (a
  `dynamic-slice` at an offset computed from the device's `partition-id`,
  after a `pad` when the rows do not divide); an unsplit program computes on
  the whole batch;
- weights: the step's variables on each device of their compiled sharding,
  at the bytes of one device's share;
- collectives: the `all-reduce`s (and other collectives) of the program,
  and the bytes the ring algorithm moves for each.

Nothing here reads what was asked for (the mesh, the constraint): a step
that XLA left on one device shows one busy device, whatever the model is.
"""

import jax
import numpy as np

from multigpu import internals
from multigpu.engines.jax import mesh as mesh_lib
from multigpu.placement import hlo, traffic

# How a collective's traffic is counted among `traffic.KINDS`: a
# reduction of per-device values (gradients, loss and metric sums) is the
# all-reduce; gathering or exchanging rows moves batch-derived tensors
# (the engine's weights are whole on every device).
_KIND = {
    "all-reduce": "all-reduce", "reduce-scatter": "all-reduce",
    "all-gather": "activations", "all-to-all": "activations",
    "ragged-all-to-all": "activations", "collective-permute": "activations",
    "collective-broadcast": "activations",
}


def device_name(device):
    """A JAX device's canonical name: `CpuDevice(id=1)` is `"/device:CPU:1"`.

    Its index is its position among JAX's devices of its platform, as
    `multigpu.available_devices` lists them on the JAX backend.
    """
    if device.platform == "cpu":
        kind, pool = "CPU", jax.devices("cpu")
    else:
        kind, pool = "GPU", [d for d in jax.devices() if d.platform == device.platform]
    return f"/device:{kind}:{pool.index(device)}"


def sharding_devices(sharding):
    """The devices of a sharding, in the order of its partitions.

    A `NamedSharding`'s partitions are its mesh's devices in order (the
    device assignment `jax.jit` compiles for); any other sharding names its
    devices in id order.
    """
    if isinstance(sharding, jax.sharding.NamedSharding):
        return [device_name(d) for d in sharding.mesh.devices.flat]
    return [device_name(d) for d in sorted(sharding.device_set, key=lambda d: d.id)]


def placed_weights(model):
    """Number and bytes of the model's variables on each device, as they are now.

    Read from each variable's array (`jax.Array.sharding`): a replicated
    variable counts once on every device, a split one at its share's bytes.

    Returns:
        A dict `{device: (count, bytes)}`.
    """
    totals = {}
    seen = set()
    for variable in model.weights:
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        value = variable.value
        shard = value.sharding.shard_shape(value.shape)
        nbytes = int(np.prod(shard)) * np.dtype(value.dtype).itemsize
        for device in sharding_devices(value.sharding):
            count, total = totals.get(device, (0, 0))
            totals[device] = (count + 1, total + nbytes)
    return totals


def step_arguments(model, x, y):
    """The step function, its arguments and the role of each flat argument.

    Args:
        model: A Keras model (compiled when `y` is given).
        x: Inputs of one batch.
        y: Targets of that batch, or None for a prediction step.

    Returns:
        `(kind, step, arguments, roles)`: `"train"` or `"predict"`, the
        model's step method, `(state, data)` as Keras's step functions pass
        them, and one of `"weight"`, `"optimizer"`, `"metric"`, `"input"`,
        `"target"` per leaf of `jax.tree.leaves(arguments)`.
    """
    weights = ([v.value for v in model.trainable_variables],
               [v.value for v in model.non_trainable_variables])
    if y is None:
        kind, step, state, data = "predict", model.predict_step, weights, (x,)
        parts = [("weight", weights), ("input", x)]
    else:
        internals.symbolic_build(model, (x, y, None))
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        optimizer = [v.value for v in model.optimizer.variables]
        metrics = [v.value for v in model.metrics_variables]
        kind, step = "train", model.train_step
        state, data = (*weights, optimizer, metrics), (x, y)
        parts = [("weight", weights), ("optimizer", optimizer),
                 ("metric", metrics), ("input", x), ("target", y)]
    mesh = getattr(model, "mesh", None)
    if isinstance(mesh, jax.sharding.Mesh):
        # As the JAX engine's step functions feed it: each batch whole on
        # every device of its mesh.
        data = mesh_lib.put_replicated(data, mesh)
    roles = [role for role, part in parts for _ in jax.tree.leaves(part)]
    return kind, step, (state, data), roles


def compile_step(model, x, y):
    """Compiles the model's step on one batch, as Keras's `fit` compiles it.

    Every argument is kept (`keep_unused=True`), so that the compiled
    program's entry parameter `k` is leaf `k` of the arguments.

    Returns:
        `(kind, compiled, arguments, roles)`: the `jax.stages.Compiled`, and
        as `step_arguments`.
    """
    kind, step, arguments, roles = step_arguments(model, x, y)
    compiled = jax.jit(step, keep_unused=True).lower(*arguments).compile()
    return kind, compiled, arguments, roles


def partition_devices(compiled, module):
    """The executable's devices, partition `i` first at `i`.

    Raises:
        RuntimeError: if the shardings do not name as many devices as the
            program has partitions.
    """
    shardings = (jax.tree.leaves(compiled.input_shardings)
                 + jax.tree.leaves(compiled.output_shardings))
    named = [s for s in shardings if isinstance(s, jax.sharding.NamedSharding)]
    devices = sharding_devices(named[0] if named else shardings[0])
    if len(devices) != module.num_partitions:
        raise RuntimeError(
            f"The compiled step has {module.num_partitions} partition(s) but its "
            f"shardings name {len(devices)} device(s) ({', '.join(devices)}); the "
            "placement of its partitions is unknown.")
    return devices


def compiled_weights(compiled, module, roles):
    """Number and bytes of the step's variables on each device, as compiled.

    Returns:
        A dict `{device: (count, bytes)}`: each variable on every device of
        its compiled sharding, at the bytes of one device's share (the
        program's entry parameter).
    """
    totals = {}
    shardings = jax.tree.leaves(compiled.input_shardings)
    for number, role in enumerate(roles):
        if role != "weight":
            continue
        nbytes = module.parameter_bytes(number)
        for device in sharding_devices(shardings[number]):
            count, total = totals.get(device, (0, 0))
            totals[device] = (count + 1, total + nbytes)
    return totals


def device_rows(module, roles, devices):
    """The batch's rows each device of the program computes on.

    Returns:
        `(rows, slice_rows, batch_rows, split)`: dicts `{device: rows}` of
        the caller's rows and of the rows of the compiled slice (padding
        included), the batch's rows, and whether the program splits them.
    """
    data = [n for n, role in enumerate(roles) if role in ("input", "target")
            and module.parameter_rows(n) is not None]
    if not data:
        return {}, {}, None, False
    slices = module.row_slices()
    split = next((slices[n] for n in data if n in slices), None)
    total = module.parameter_rows(split.parameter if split else data[0])
    if split is None:
        return ({d: total for d in devices}, {d: total for d in devices},
                total, False)
    rows = {d: hlo.rows_of_slice(total, split, i) for i, d in enumerate(devices)}
    return rows, dict.fromkeys(devices, split.rows), total, True


def collective_transfers(collectives, devices):
    """The collectives' traffic between the program's devices.

    Each device runs every collective of the program; a collective over
    `n` devices is counted as the ring algorithm moves it: each device
    sends to the next `2 (n - 1) / n` of an all-reduce's bytes,
    `(n - 1) / n` of a reduce-scatter's or all-to-all's, `n - 1` times
    its piece of an all-gather, and a collective-permute its operand to
    each target.

    Returns:
        A list of `traffic.Transfer`.
    """
    n = len(devices)
    transfers = []
    if n < 2:
        return transfers
    for c in collectives:
        kind = _KIND.get(c.op, "all-reduce")
        if c.pairs is not None:
            transfers += [
                traffic.Transfer(devices[s], devices[t], kind, c.name, c.bytes)
                for s, t in c.pairs if s != t and max(s, t) < n]
            continue
        if c.op == "all-reduce":
            sent = traffic.ring_allreduce_bytes(c.bytes, n)
        elif c.op == "all-gather":
            sent = float((n - 1) * c.bytes)
        else:
            sent = (n - 1) / n * c.bytes
        transfers += [
            traffic.Transfer(device, devices[(i + 1) % n], kind, c.name, sent)
            for i, device in enumerate(devices)]
    return transfers


def observe_compiled_step(model, x, y):
    """What XLA compiled for one step of `model` on (x, y).

    Args:
        model: A Keras model on the JAX backend (compiled when `y` is
            given).
        x: Inputs of one batch.
        y: Targets of that batch, or None for a prediction step.

    Returns:
        A dict: `kind` (`"train"`, `"predict"`), `devices` (the
        executable's, partition order), `weights` (`{device: (count,
        bytes)}`), `rows`, `slice_rows` (`{device: rows}`), `batch_rows`,
        `split` (whether the program splits the batch), `ops`
        (instructions of the program), `collectives` (a list of
        `hlo.Collective`), `transfers` and `text` (the compiled HLO).

    Example:
    >>> step = observe_compiled_step(parallel, x[:10], y[:10])
    >>> step["rows"]
    {'/device:CPU:0': 3, '/device:CPU:1': 3, '/device:CPU:2': 3, '/device:CPU:3': 1}
    """
    kind, compiled, _, roles = compile_step(model, x, y)
    text = compiled.as_text()
    module = hlo.Module(text)
    devices = partition_devices(compiled, module)
    rows, slice_rows, batch_rows, split = device_rows(module, roles, devices)
    collectives = module.collectives() if len(devices) > 1 else []
    return {
        "kind": kind,
        "devices": devices,
        "weights": compiled_weights(compiled, module, roles),
        "rows": rows,
        "slice_rows": slice_rows,
        "batch_rows": batch_rows,
        "split": split,
        "ops": module.op_count(),
        "collectives": collectives,
        "transfers": collective_transfers(collectives, devices),
        "text": text,
    }
