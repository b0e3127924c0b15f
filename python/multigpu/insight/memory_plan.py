"""Will it fit: the bytes one device holds to train a model, and the batch that fits.

`memory_plan` counts what data parallelism puts on each device for one
training step, with each replica taking `batch_size / devices` rows:

* `weights`: every variable of the model (trainable or not), counted exactly
  from the variables' shapes and dtypes (a float32 weight is 4 bytes);
* `gradients`: one gradient per trainable variable, of its dtype, exactly;
* `optimizer`: the optimizer's own variables (slots such as Adam's two
  moments, its iteration count and learning rate, accumulators), counted
  exactly on a fresh copy of the optimizer built for the model's trainable
  variables: the user's optimizer is not touched;
* `activations`: an estimate from the traced forward pass at the
  per-replica batch: the bytes of every tensor the forward pass produces
  (the batch included, weights and ops that only forward a buffer
  excluded). The backward pass keeps a subset of these alive, and
  TensorFlow reuses buffers, so this is an upper estimate of the
  activations' share;
* `total`: their sum.

`find_batch_size` inverts the plan: the activations grow linearly with the
rows, the rest does not.

The forward pass is traced by the backend's runtime
(`multigpu.runtime.tensorflow.forward_bytes` with `tf.function`,
`multigpu.runtime.jax.forward_bytes` with `jax.make_jaxpr`); this module
imports no TensorFlow.
"""

import math

import keras
import numpy as np

from multigpu import arguments, backends, messages, runtime
from multigpu.devices import HOST_DEVICE, resolve_devices
from multigpu.engines.compiled import fresh_optimizer
from multigpu.placement import format_bytes
from multigpu.placement.table import text_table
from multigpu.variables import variable_bytes

ENTRIES = ("weights", "gradients", "optimizer", "activations", "total")




class MemoryPlan:
    """The bytes one device holds to train a model: what `memory_plan` returns.

    Attributes:
        weights, gradients, optimizer, activations, total: Bytes on one
            device (ints).
        batch_size: The global batch planned for.
        per_replica_batch: The rows of the largest replica's share.
        devices: The devices, canonical names.
        device_memory: `{device: bytes}` as TensorFlow reports each device's
            memory, None for a device that does not report it (CPUs).
        fits: Whether `total` fits every reporting device's memory; None
            when no device reports it.
        notes: What the numbers mean, one sentence each.
        per_device: For a model whose weights are split across devices
            (`model_parallel` on JAX): `{device: {entry: bytes}}`, each
            device's own entries; the plan's entries are the largest
            device's. None otherwise (every device holds the same).

    Example:
    >>> plan = multigpu.memory_plan(model, batch_size=256, gpus=4,
    ...                             optimizer="adam")
    >>> plan["optimizer"] == 2 * plan["weights"] + 12   # m, v, iterations, lr
    True
    """

    per_device = None

    def __init__(self, entries, batch_size, per_replica_batch, devices,
                 device_memory, notes):
        for name in ENTRIES:
            setattr(self, name, int(entries[name]))
        self.batch_size = batch_size
        self.per_replica_batch = per_replica_batch
        self.devices = list(devices)
        self.device_memory = dict(device_memory)
        reported = [m for m in self.device_memory.values() if m is not None]
        self.fits = all(self.total <= m for m in reported) if reported else None
        self.notes = list(notes)

    def __getitem__(self, name):
        if name not in ENTRIES:
            raise KeyError(
                f"A memory plan has the entries {messages.literals(ENTRIES)}; "
                f"received {messages.literal(name)}.")
        return getattr(self, name)

    def as_dict(self):
        """The plan as a dict: the entries, the batch, devices and notes."""
        return {
            **{name: getattr(self, name) for name in ENTRIES},
            "batch_size": self.batch_size,
            "per_replica_batch": self.per_replica_batch,
            "devices": list(self.devices),
            "device_memory": dict(self.device_memory),
            "fits": self.fits,
            "notes": list(self.notes),
            **({} if self.per_device is None else {"per_device": {
                d: dict(e) for d, e in self.per_device.items()}}),
        }

    def table(self):
        """The plan as text: one line per entry, then each device's memory."""
        rows = [(name, format_bytes(getattr(self, name)), f"{getattr(self, name):,}")
                for name in ENTRIES]
        lines = [
            f"Memory plan: global batch {self.batch_size} on "
            f"{len(self.devices)} devices ({self.per_replica_batch} rows per "
            "replica); bytes on each device",
            *text_table(("entry", "size", "bytes"), rows),
        ]
        for device, entries in (self.per_device or {}).items():
            lines.append(f"{device}: " + ", ".join(
                f"{name} {format_bytes(entries[name])}" for name in ENTRIES))
        for device, memory in self.device_memory.items():
            if memory is None:
                lines.append(f"{device}: memory not reported by {_runtime()}")
            else:
                verdict = "fits" if self.total <= memory else "does NOT fit"
                lines.append(f"{device}: {format_bytes(memory)}, {verdict} "
                             f"({100 * self.total / memory:.0f}% used)")
        return "\n".join(lines)

    def __repr__(self):
        return self.table()


def _template(model):
    """The model whose variables an engine's replicas share."""
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Invalid `model`: received an object of type {type(model).__name__}; "
            "expected a Keras model.")
    template = getattr(model, "template", None)
    return template if isinstance(template, keras.Model) else model


def _input_specs(model, rows):
    inputs = getattr(model, "inputs", None) if model.built else None
    if not inputs:
        raise ValueError(
            f"Invalid `model`: {model.name!r} is not built, so its input shape "
            "is unknown. Give it an input shape (an Input layer, or "
            "`input_shape` in R) or call it on one batch first.")
    return [((rows,) + tuple(i.shape[1:]), i.dtype) for i in inputs]


def activation_bytes(model, rows):
    """Bytes of the tensors a training-mode forward pass produces on `rows` rows.

    The forward pass is traced (nothing runs) at a batch of `rows`; every
    output of every op is counted once, except the weights' reads and the
    ops that forward a buffer or describe shapes (`Identity`, `Reshape`,
    `Shape`, ...). The batch itself counts.

    Args:
        model: A built Keras model (the template of an engine's model).
        rows: The batch's rows, an int >= 1.

    Returns:
        The bytes, an int.

    Raises:
        ValueError: if the model is not built.

    Example:
    >>> activation_bytes(keras.Sequential([keras.Input((4,)),
    ...                                    keras.layers.Dense(8)]), 2)
    160
    """
    model = _template(model)
    return runtime.of_backend().forward_bytes(model, _input_specs(model, rows))


def _unbuilt_optimizer(optimizer, model, source):
    """A new optimizer for the `optimizer` argument: a name, an instance
    (`compiled.fresh_optimizer`), or None for the compiled one."""
    if optimizer is None:
        optimizer = getattr(source, "optimizer", None) or getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError(
                "Invalid `optimizer`: received "
                f"{messages.literal(None)} and the model is not compiled. "
                "Pass the optimizer training will use, e.g. "
                f"{messages.setting('optimizer', 'adam')}, or compile the "
                "model first.")
    if isinstance(optimizer, str):
        return keras.optimizers.get(optimizer)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return fresh_optimizer(optimizer)
    raise TypeError(
        f"Invalid `optimizer`: received an object of type {type(optimizer).__name__}; "
        "expected a Keras optimizer, its name (e.g. "
        f"{messages.literal('adam')}) or {messages.literal(None)} for the "
        "model's compiled one.")


def optimizer_bytes(optimizer, model):
    """Bytes of `optimizer`'s variables once built for `model`'s weights.

    A copy of the optimizer (from its config) is built on the CPU for the
    model's trainable variables and its variables' bytes summed: Adam's two
    moments per weight, SGD's momentum when it has one, the iteration count
    and learning rate, accumulators. The copy is then dropped.

    Args:
        optimizer: A Keras optimizer or its name.
        model: A built Keras model.

    Returns:
        The bytes, an int.

    Example:
    >>> optimizer_bytes("sgd", model)   # iterations (int64), learning rate
    12
    """
    fresh = _unbuilt_optimizer(optimizer, _template(model), model)
    with runtime.of_backend().device_scope(HOST_DEVICE):
        fresh.build(_template(model).trainable_variables)
    return sum(variable_bytes(v) for v in fresh.variables)


def _runtime():
    """The runtime that reports the devices' memory: TensorFlow or JAX."""
    return runtime.of_backend().NAME


def _reported_memory(device):
    """Bytes of `device`'s memory as the backend's runtime reports it, or None.

    GPUs only (`runtime.of_backend().memory_limit`); CPUs report no limit
    of their own.
    """
    if ":GPU:" not in device.upper():
        return None
    return runtime.of_backend().memory_limit(device)


def _check_memory(device_memory):
    if device_memory is None:
        return None
    if (isinstance(device_memory, (bool, np.bool_))
            or not isinstance(device_memory, (int, float, np.integer, np.floating))
            or not math.isfinite(device_memory) or device_memory <= 0):
        raise ValueError(
            f"Invalid `device_memory`: received {messages.literal(device_memory)}; "
            "expected the bytes of one device's memory, a number > 0 "
            f"(e.g. {messages.literal(16 * 2**30)} for 16 GiB), or "
            f"{messages.literal(None)} for what {_runtime()} reports.")
    return int(device_memory)


def _plan_entries(model, rows, optimizer):
    template = _template(model)
    weights = sum(variable_bytes(v) for v in template.variables)
    gradients = sum(variable_bytes(v) for v in template.trainable_variables)
    slots = optimizer_bytes(_unbuilt_optimizer(optimizer, template, model), template)
    activations = activation_bytes(template, rows)
    return {"weights": weights, "gradients": gradients, "optimizer": slots,
            "activations": activations,
            "total": weights + gradients + slots + activations}


def memory_plan(model, batch_size, gpus=None, optimizer=None, device_memory=None):
    """The bytes each device holds to train `model` on a global batch.

    Data parallelism puts the same on every device: all weights, one
    gradient per trainable weight, the optimizer's variables and the
    activations of the device's share of the batch. Weights, gradients and
    optimizer variables are counted exactly (a float32 weight is 4 bytes;
    the optimizer's are counted on a fresh copy built for the model);
    activations are estimated from the traced forward pass at the
    per-replica batch (see `activation_bytes`). The total is compared with
    each device's memory where TensorFlow reports it (GPUs); CPUs do not
    report one. On CPU the plan's total was checked against the
    allocator's measured peak of a training step (docs/training.md, "Will
    it fit?", states the tolerance).

    Args:
        model: A Keras model, or a model returned by `multi_gpu_model` (its
            template is planned). It must be built (have an input shape).
        batch_size: The global batch, an int >= 1; each replica gets
            `ceil(batch_size / devices)` rows at most.
        gpus: The devices, as `multi_gpu_model`'s `gpus` reads them (None:
            every GPU, or every logical CPU device without GPUs).
        optimizer: A Keras optimizer or its name; None for the model's
            compiled optimizer.
        device_memory: Bytes of one device's memory, to use instead of what
            TensorFlow reports; None to use what it reports.

    Returns:
        A `MemoryPlan` (`plan["total"]`, `plan.fits`, `print(plan)`).

    Raises:
        ValueError: for a batch that is not an int >= 1, devices this machine
            lacks, an unbuilt model, no optimizer, or a bad `device_memory`.
        TypeError: if `model` is not a Keras model or `optimizer` is neither
            an optimizer nor a name.

    Example:
    >>> plan = multigpu.memory_plan(model, batch_size=256, gpus=4,
    ...                             optimizer="adam")
    >>> print(plan)
    """
    batch_size = arguments.check_int(
        "batch_size", batch_size, 1, "the global batch, a whole number >= 1")
    memory = _check_memory(device_memory)
    # A model whose weights are split across devices (`model_parallel` on
    # JAX) says itself what each device holds.
    if getattr(model, "bytes_by_device", None) is not None:
        return _plan_by_device(model, batch_size, gpus, optimizer, memory)
    devices = resolve_devices(gpus)
    _template(model)
    rows = math.ceil(batch_size / len(devices))
    entries = _plan_entries(model, rows, optimizer)
    reported = {d: memory if memory is not None else _reported_memory(d)
                for d in devices}
    notes = [
        "Each device holds all weights, one gradient per trainable weight "
        "and the optimizer's variables (exact counts), and the activations "
        "of its rows (estimated from the traced forward pass).",
    ]
    if memory is not None:
        notes.append(f"Device memory as given: {format_bytes(memory)} each.")
    elif all(m is None for m in reported.values()):
        notes.append(f"{_runtime()} does not report these devices' memory "
                     "(CPU devices); pass device_memory to compare.")
    return MemoryPlan(entries, batch_size, rows, devices, reported, notes)


def _plan_by_device(model, batch_size, gpus, optimizer, memory):
    """`memory_plan` of a model whose weights are split across its devices.

    Weights, gradients and the optimizer's variables are each device's
    shards (`model.bytes_by_device`, on a fresh optimizer); the
    activations are the whole batch's, which every device computes on.
    """
    if gpus is not None and resolve_devices(gpus) != list(model.devices):
        raise ValueError(
            f"Invalid `gpus`: received {messages.literal(gpus)}, but the "
            f"weights of {messages.literal(model.name)} are split across "
            f"{messages.literal(list(model.devices))}. Leave "
            f"{messages.setting('gpus', None)} to plan for those devices.")
    fresh = _unbuilt_optimizer(optimizer, _template(model), model)
    activations = activation_bytes(model, batch_size)
    per_device = {}
    for device, held in model.bytes_by_device(fresh).items():
        held = dict(held, activations=activations)
        per_device[device] = dict(held, total=sum(held.values()))
    largest = max(per_device.values(), key=lambda entries: entries["total"])
    reported = {d: memory if memory is not None else _reported_memory(d)
                for d in per_device}
    notes = [
        "The weights are split across the devices: each holds its shards "
        "of the weights, of their gradients and of the optimizer's slots "
        "(read from the shards), and every device computes on the whole "
        "batch (its activations estimated from the traced forward pass, "
        "an upper estimate: XLA splits those of split layers too). The "
        "entries are the largest device's; per_device has each one's.",
    ]
    plan = MemoryPlan(largest, batch_size, batch_size, list(per_device),
                      reported, notes)
    plan.per_device = per_device
    return plan


def _device_memory_or_fail(devices, memory):
    if memory is not None:
        return memory
    reported = [_reported_memory(d) for d in devices]
    if any(m is None for m in reported):
        silent = [d for d, m in zip(devices, reported) if m is None]
        raise ValueError(
            f"Invalid `device_memory`: received {messages.literal(None)}, but "
            f"{_runtime()} does not report the memory of {messages.literal(silent)}. "
            "Pass the bytes of one device's memory, e.g. "
            f"{messages.setting('device_memory', 16 * 2**30)} for 16 GiB.")
    return min(reported)


def find_batch_size(model, gpus=None, device_memory=None, optimizer=None,
                    trial=None, max_batch_size=2**20):
    """The largest global batch whose plan fits every device's memory.

    Weights, gradients and optimizer variables do not depend on the batch;
    the activations grow linearly with the rows (`activation_bytes` at 1
    and 2 rows per replica gives the slope). The largest per-replica batch
    whose `memory_plan` total fits is found from that line and checked
    with the plan itself; the global batch is that times the devices. With
    `trial` (the default on GPUs), a forward and backward pass of that many
    rows then runs on the first device, and the batch backs off by 10% on
    each out-of-memory error until one runs.

    Args:
        model: A built Keras model or an engine's model (its template).
        gpus: The devices, as `multi_gpu_model`'s `gpus` reads them.
        device_memory: Bytes of one device's memory; None for what
            TensorFlow reports (GPUs only: on CPUs it must be given).
        optimizer: A Keras optimizer or its name; None for the compiled one.
        trial: Whether to run the trial steps; None: only when every device
            is a GPU, on TensorFlow (`trial=True` runs on TensorFlow only).
        max_batch_size: The largest global batch returned, an int >= 1.

    Returns:
        The global batch, an int, a multiple of the number of devices.

    Raises:
        ValueError: for a bad argument, devices that do not report their
            memory without `device_memory`, or a model whose weights,
            gradients and optimizer alone do not fit, or that fits not even
            one row per device.

    Example:
    >>> multigpu.find_batch_size(model, gpus=4, device_memory=16 * 2**30,
    ...                          optimizer="adam")
    """
    memory = _check_memory(device_memory)
    max_batch_size = arguments.check_int("max_batch_size", max_batch_size, 1)
    if trial is not None:
        trial = arguments.check_flag("trial", trial)
    if trial:
        backends.require_backend(
            "find_batch_size", "TensorFlow's out-of-memory error to back off "
            "from a trial step", written=f"{messages.api('find_batch_size')} "
            f"with {messages.setting('trial', True)}",
            otherwise=f"leave {messages.setting('trial', None)}")
    devices = resolve_devices(gpus)
    n = len(devices)
    memory = _device_memory_or_fail(devices, memory)
    template = _template(model)
    fixed = _plan_entries(model, 1, optimizer)
    fixed_bytes = fixed["total"] - fixed["activations"]
    one, two = fixed["activations"], activation_bytes(template, 2)
    slope = max(two - one, 1)
    intercept = one - slope
    rows = min((memory - fixed_bytes - intercept) // slope, max_batch_size // n)
    while rows >= 1 and fixed_bytes + activation_bytes(template, rows) > memory:
        rows = min(rows - 1, int(rows * 0.95))
    if rows < 1:
        need = fixed_bytes + one
        raise ValueError(
            f"Not even one row per device fits: training {model.name!r} needs "
            f"{format_bytes(need)} per device with one row "
            f"(weights, gradients and optimizer: {format_bytes(fixed_bytes)}), "
            f"and a device has {format_bytes(memory)}. Use a smaller model or "
            f"optimizer, or {messages.api('model_parallel')} to split the "
            "model between devices.")
    if trial is None:
        trial = runtime.of_backend().trial_by_default(devices)
    if trial:
        rows = _back_off(model, devices[0], rows)
    return int(rows * n)


def _back_off(model, device, rows):
    """The rows of the largest trial pass that runs on `device` (TensorFlow)."""
    from multigpu.runtime import tensorflow as tensorflow_runtime

    template = _template(model)
    while True:
        try:
            tensorflow_runtime.trial_pass(
                template, device, _input_specs(template, rows))
            return rows
        except tensorflow_runtime.OUT_OF_MEMORY:
            if rows <= 1:
                raise
            rows = max(1, min(rows - 1, int(rows * 0.9)))

