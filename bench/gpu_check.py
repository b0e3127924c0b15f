"""One check of multigpu on a machine's GPUs: every claim a GPU can confirm.

    python -m bench.gpu_check --out out/gpu-check.json            # GPUs
    python -m bench.gpu_check --small --out out/gpu-check.json    # CPU, seconds

Needs JAX (and Keras) or TensorFlow, on the backend KERAS_BACKEND names,
and no network; on `KERAS_BACKEND=jax` it imports no TensorFlow, so it runs
on a GPU image without it. It runs, through the package's public calls, one
row each (`ROWS`):

* `device_discovery`: `multi_gpu_model(model, gpus=None)`, the devices it
  found, how many replicas and the warning it gave;
* `engine_vs_keras_fit`: the engine's `fit` beside Keras's own `fit` on the
  same devices (one device: the plain model; several: Keras's
  `DataParallel` on JAX, `multigpu.mirrored_strategy` on TensorFlow), same
  model and batch, timed in turn in this process (`bench.paired.pair`);
* `memory_plan`: `memory_plan(model, batch)` against the peak of the first
  device's allocator over a training step;
* `find_batch_size_oom`: `find_batch_size` with the reported memory, then a
  step of many times that batch, which must fail with RESOURCE_EXHAUSTED,
  after which the device's memory in use returns to what it was, and a
  step at the batch found, which must run;
* `mixed_float16`, `mixed_bfloat16`: the model trained through
  `multi_gpu_model` under the policy beside float32;
* `xla`: the same with `jit_compile=True` beside without;
* `scaling`: on several devices, the engine's step against one device's,
  as an efficiency beside what `multigpu.insight.scaling.predict_step`
  predicts from a ring all-reduce of the gradients.

Every comparison with one device's numbers has a tolerance measured from two
identical one-device runs (`SPREAD_MULTIPLE` times their difference), with a
floor for rounding (`ROUNDING_FLOORS`); each row says which one decided.
Where a capability is missing (no GPU: no device memory statistics, no
memory limit) the row is "skipped" with the reason, its call path still run.

`--out FILE` writes the rows as JSON (`{"rows": [...], ...}`); the table goes
to stdout.
"""

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import time
import warnings

import numpy as np

from bench import paired

ROWS = ("device_discovery", "engine_vs_keras_fit", "memory_plan",
        "find_batch_size_oom", "mixed_bfloat16", "mixed_float16", "xla",
        "scaling")

# A difference between two runs is "the same" within this many times the
# spread of two identical one-device runs: the spread is one draw of the
# run-to-run noise (GPU reductions are not ordered), a larger one is likely.
SPREAD_MULTIPLE = 3.0
# The least tolerance, as a relative difference (see `difference`), for the
# arithmetic a run computes in. Identical runs on a deterministic device
# differ by 0, yet splitting a batch reorders the sums of its gradients
# (float32: parallel against one device differs by about 1e-6 here). A
# mixed policy rounds every product to 16 bits, and the updates of a batch
# with random labels are sums that largely cancel, so its weights end
# about 4.5e-2 of the largest update from float32's on one CPU device
# (float16 and bfloat16 alike, 4 steps of the small MLP); 0.1 stays below
# what one lost step of an epoch moves (1/8 of the update, full size).
ROUNDING_FLOORS = {"float32": 1e-4, "mixed_float16": 0.1,
                   "mixed_bfloat16": 0.1}
# A policy's parallel run may differ from float32's by this many times what
# the policy does on one device (measured beside it), where that is more.
POLICY_MULTIPLE = 2.0
# docs/training.md ("Will it fit?"): the plan's total is within 0.5x to 2x
# of the measured peak of a training step.
MEMORY_BAND = (0.5, 2.0)
MEMORY_SOURCE = "docs/training.md, Will it fit?: plan within 0.5x to 2x"
# After the out-of-memory step, memory in use may exceed what it was by the
# allocator's rounding and the step's cached constants: 1 MiB.
LEAK_SLACK_BYTES = 2**20
LEAK_SOURCE = "LEAK_SLACK_BYTES: allocator rounding, cached constants"
# The failing step's batch: this many times the batch `find_batch_size`
# found, whose plan needs about as many times the device's memory.
OOM_FACTOR = 4
# The link of the scaling model when the GPU's name does not say
# (`_link`); logical CPU devices pass references (`host_memory`).
DEFAULT_GPU_LINK = "pcie4"
SCALING_SOURCE = ("none: the efficiency is reported beside the ring "
                  "all-reduce model's, without a verdict")

# What each size trains: the MLP's inputs, width, depth; global batch;
# steps per epoch; timed rounds (one epoch each).
SIZES = {
    "small": dict(features=32, width=64, depth=2, batch=32, steps=4,
                  rounds=3),
    "full": dict(features=3072, width=2048, depth=3, batch=256, steps=8,
                 rounds=15),
}
LEARNING_RATE = 0.05


def parse_args(argv=None):
    """The command line: `--small`, `--out FILE`, `--devices N`."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check")
    parser.add_argument("--small", action="store_true",
                        help="tiny model, few steps (the CPU case)")
    parser.add_argument("--out", default="out/gpu-check.json",
                        help="the JSON file of the rows")
    parser.add_argument("--devices", type=int, default=None,
                        help="devices to use (default: every GPU; 2 logical "
                             "CPU devices without GPU)")
    return parser.parse_args(argv)


def backend_name():
    """Keras's backend as the environment chooses it (its default: TF)."""
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def set_up_devices(count):
    """Chooses the devices before the backend starts; returns how many CPUs.

    On a GPU machine `count` GPUs are made visible (CUDA_VISIBLE_DEVICES,
    unless set); without GPU, `multigpu.virtual_devices(count or 2)` makes
    logical CPU devices, so that the multi-device rows run. On JAX the CPU
    count applies to JAX's CPU platform only, so setting it where a GPU
    turns out to be present changes nothing the rows use.

    Args:
        count: `--devices`, or None.

    Returns:
        The logical CPU devices asked for.
    """
    import multigpu

    if count and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(count)))
    cpus = count or 2
    if backend_name() == "tensorflow":
        import tensorflow as tf

        if tf.config.list_physical_devices("GPU"):
            return 1
    if cpus > 1:
        multigpu.virtual_devices(cpus)
    return cpus


# --- What the rows share -------------------------------------------------


def has_gpu():
    """Whether the backend's devices include a GPU."""
    import multigpu

    return bool(multigpu.available_devices()["GPU"])


def device_description(devices):
    """`"2 x Intel(R) Xeon(R) Processor (/device:CPU:0, ...)"`."""
    kind = _device_kind(devices[0])
    return f"{len(devices)} x {kind} ({', '.join(devices)})"


def _device_kind(name):
    if ":GPU:" in name:
        if backend_name() == "jax":
            import jax

            return jax.devices("gpu")[int(name.rsplit(":", 1)[1])].device_kind
        import tensorflow as tf

        gpu = tf.config.list_physical_devices("GPU")[int(name.rsplit(":", 1)[1])]
        return tf.config.experimental.get_device_details(gpu).get(
            "device_name", "GPU")
    return processor()


def processor():
    """The CPU's model name (`/proc/cpuinfo`), or the platform's."""
    import platform

    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def build_model(size, policy="float32"):
    """The checked MLP under `policy`; its output layer is float32.

    Args:
        size: A value of `SIZES`.
        policy: A dtype policy's name.

    Returns:
        A functional `keras.Model` with softmax outputs over 10 classes.
    """
    import keras

    from bench import models

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        inputs = keras.Input((size["features"],), name="features")
        x = inputs
        for i in range(size["depth"]):
            x = keras.layers.Dense(size["width"], activation="relu",
                                   name=f"hidden_{i}")(x)
        # float32 softmax and loss under any policy, as Keras's guides advise.
        outputs = keras.layers.Dense(models.NUM_CLASSES, activation="softmax",
                                     dtype="float32", name="label")(x)
        return keras.Model(inputs, outputs, name="checked_mlp")
    finally:
        keras.config.set_dtype_policy(previous)


def data(size):
    """`(x, y)`: an epoch of `size["steps"]` batches, synthetic, seeded."""
    rng = np.random.default_rng(0)
    rows = size["batch"] * size["steps"]
    x = rng.standard_normal((rows, size["features"]), dtype=np.float32)
    y = rng.integers(0, 10, size=rows, dtype=np.int32)
    return x, y


def default_jit():
    """The `jit_compile` of the rows that do not vary it.

    JAX's engine compiles always (it refuses False); TensorFlow's default on
    CPUs is without XLA, and the same setting on both sides is what counts.
    """
    return backend_name() == "jax"


def compiled(model, weights, jit_compile=None, policy="float32"):
    """`model` with `weights`, compiled with SGD and cross-entropy."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model.set_weights(weights)
        model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE),
                      loss="sparse_categorical_crossentropy",
                      jit_compile=default_jit() if jit_compile is None
                      else jit_compile)
    finally:
        keras.config.set_dtype_policy(previous)
    return model


def parallel(size, weights, policy="float32", jit_compile=None):
    """`multi_gpu_model(gpus=None)` of a fresh build under `policy`, compiled."""
    import multigpu

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = multigpu.multi_gpu_model(build_model(size, policy), gpus=None)
    return compiled(model, weights, jit_compile, policy)


class Trained:
    """A model, its epoch (`step`), and its loss and weights after one epoch.

    The first epoch is the one compared (from the shared start, the batches
    in order); it also compiles the step, so the timed epochs exclude it.

    Attributes:
        model: The compiled model.
        step: A function of no argument: one more epoch.
        loss: The first epoch's last loss.
        weights: The weights after the first epoch.
    """

    def __init__(self, model, x, y, batch, scope=None):
        self.model = model
        self._x, self._y, self._batch, self._scope = x, y, batch, scope
        history = self._epoch()
        self.loss = float(history.history["loss"][-1])
        self.weights = [np.asarray(w, dtype=np.float64)
                        for w in model.get_weights()]

    def _epoch(self):
        if self._scope is None:
            return self.model.fit(self._x, self._y, batch_size=self._batch,
                                  epochs=1, shuffle=False, verbose=0)
        with self._scope():
            return self.model.fit(self._x, self._y, batch_size=self._batch,
                                  epochs=1, shuffle=False, verbose=0)

    def step(self):
        self._epoch()


def difference(a, b, start):
    """How far two trained models are apart, relative to how far they moved.

    Args:
        a, b: `Trained` models from the same start.
        start: The starting weights.

    Returns:
        The larger of the losses' relative difference and the weights'
        largest difference over the largest update of `b`'s weights.
    """
    moved = max(float(np.max(np.abs(w - s)))
                for w, s in zip(b.weights, start, strict=True))
    apart = max(float(np.max(np.abs(u - w)))
                for u, w in zip(a.weights, b.weights, strict=True))
    loss = abs(a.loss - b.loss) / max(abs(b.loss), 1e-12)
    return max(apart / max(moved, 1e-30), loss)


def tolerance(spread, floor_name, policy_difference=None):
    """`(tolerance, source)`: the largest of the spread's, the floor, the policy's.

    Args:
        spread: `difference` of two identical one-device runs.
        floor_name: A key of `ROUNDING_FLOORS`.
        policy_difference: What a mixed policy's one-device run differs
            from float32's, or None.

    Returns:
        The tolerance and a sentence saying where it came from.

    Example:
    >>> tolerance(0.0, "float32")
    (0.0001, 'rounding floor float32 (0.0001); two identical ...')
    """
    floor = ROUNDING_FLOORS[floor_name]
    candidates = [
        (floor, f"rounding floor {floor_name} ({floor:g}); two identical "
                f"one-device runs differ by {spread:.2e}"),
        (SPREAD_MULTIPLE * spread,
         f"{SPREAD_MULTIPLE:g} x the spread of two identical one-device "
         f"runs ({spread:.2e})")]
    if policy_difference is not None:
        candidates.append((
            POLICY_MULTIPLE * policy_difference,
            f"{POLICY_MULTIPLE:g} x what {floor_name} does on one device "
            f"({policy_difference:.2e}); spread {spread:.2e}"))
    return max(candidates, key=lambda candidate: candidate[0])


def step_ms(seconds, size):
    """Milliseconds per training step of epochs' seconds."""
    return 1e3 * statistics.median(seconds) / size["steps"]


def row(name, status, device, started, reason=None, **cells):
    """One row of the results; `reason` is required for "skipped"."""
    result = {"name": name, "status": status, "device": device,
              "seconds": round(time.perf_counter() - started, 3)}
    if reason:
        result["reason"] = reason
    result.update(cells)
    return result


def verdict(measured, allowed):
    """"ok" when `measured` is within `allowed`, else "differs"."""
    return "ok" if measured <= allowed else "differs"


class Context:
    """What every row uses: the size, data, devices and one-device runs.

    Attributes:
        size: A value of `SIZES`.
        x, y: The epoch's data.
        start: The template's starting weights.
        devices: The devices `gpus=None` resolved to (`device_discovery`).
        reference: The plain model trained on one device.
        spread: Its `difference` from a twin trained alike.
    """

    def __init__(self, size, devices):
        import random

        # Seeds Keras's initializers' seeds (drawn from `random`) and the
        # data; not `keras.utils.set_random_seed`, which imports TensorFlow
        # wherever it is installed, to seed it too.
        random.seed(0)
        np.random.seed(0)
        self.size = size
        self.x, self.y = data(size)
        self.start = [np.asarray(w, dtype=np.float64)
                      for w in build_model(size).get_weights()]
        self.devices = devices

    @functools.cached_property
    def reference(self):
        """The plain model trained on one device: what the rows compare with.

        Trained on first use, after the memory row, whose peak it would
        otherwise raise (JAX's peak is the process's).
        """
        return self.one_device()

    @functools.cached_property
    def spread(self):
        """`difference` of the reference and its twin, trained alike."""
        return difference(self.one_device(), self.reference, self.start)

    def one_device(self, policy="float32", jit_compile=None):
        """The plain model trained on the first device (Keras's placement)."""
        model = compiled(build_model(self.size, policy), self.start,
                         jit_compile, policy)
        return Trained(model, self.x, self.y, self.size["batch"])

    def parallel(self, policy="float32", jit_compile=None):
        """The model through `multi_gpu_model`, trained one epoch."""
        model = parallel(self.size, self.start, policy, jit_compile)
        return Trained(model, self.x, self.y, self.size["batch"])

    def describe(self):
        return device_description(self.devices)


# --- The rows ------------------------------------------------------------


def device_discovery(size):
    """`multi_gpu_model(model, gpus=None)`: the devices, replicas, warning.

    It runs first: the package warns once per process, on the first call
    that resolves `gpus=None`.

    Returns:
        `(row, devices)`.
    """
    import multigpu

    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = multigpu.multi_gpu_model(build_model(size), gpus=None)
    messages = [str(w.message) for w in caught
                if issubclass(w.category, UserWarning)]
    machine = multigpu.available_devices()
    found = list(model.devices)
    # Without GPU, gpus=None takes every logical CPU device and says so.
    expected = machine["GPU"] or machine["CPU"]
    status = "ok" if found == expected else "differs"
    return row("device_discovery", status, device_description(found), started,
               found=found, replicas=len(found), engine=model.engine,
               gpus=machine["GPU"], cpus=machine["CPU"], warnings=messages,
               tolerance=0, tolerance_source="exact: every GPU, or every "
               "logical CPU device without GPU",
               summary=f"{len(found)} replicas ({model.engine}); "
                       + ("; ".join(messages) or "no warning")), found


def _keras_fit(context):
    """Keras's own `fit` on the same devices: `(Trained, what it is)`."""
    devices, size = context.devices, context.size
    if len(devices) == 1:
        return context.one_device(), "plain Keras model"
    if backend_name() == "jax":
        from bench import jax_throughput

        anchor = jax_throughput._anchor(devices)
        with anchor.scope():
            model = compiled(build_model(size), context.start)
        return (Trained(model, context.x, context.y, size["batch"],
                        scope=anchor.scope), "keras.distribution.DataParallel")
    import multigpu

    strategy = multigpu.mirrored_strategy(devices=devices)
    with strategy.scope():
        model = compiled(build_model(size), context.start)
    return (Trained(model, context.x, context.y, size["batch"]),
            "tf.distribute.MirroredStrategy (multigpu.mirrored_strategy)")


def engine_vs_keras_fit(context, built):
    """The engine's `fit` beside Keras's own, timed in turn; both vs one device."""
    started = time.perf_counter()
    engine = built.setdefault("float32", context.parallel())
    keras_fit, what = _keras_fit(context)
    seconds = paired.pair({"engine": engine.step, "keras": keras_fit.step},
                          rounds=context.size["rounds"], warmup=1)
    allowed, source = tolerance(context.spread, "float32")
    measured = difference(engine, context.reference, context.start)
    keras_measured = difference(keras_fit, context.reference, context.start)
    engine_ms, keras_ms = (step_ms(seconds[k], context.size)
                           for k in ("engine", "keras"))
    ratio = paired.ratio("ratio", seconds["engine"], seconds["keras"])
    return row("engine_vs_keras_fit",
               verdict(max(measured, keras_measured), allowed),
               context.describe(), started, keras=what,
               engine_ms_per_step=engine_ms, keras_ms_per_step=keras_ms,
               **ratio, difference=measured, keras_difference=keras_measured,
               tolerance=allowed, tolerance_source=source,
               summary=f"engine {engine_ms:.2f} ms/step, {what} "
                       f"{keras_ms:.2f}: {ratio['ratio']:.2f}x; difference "
                       f"from one device {measured:.1e}")


def _memory_stats(device):
    """`(bytes in use, peak bytes)` of `device`, or a reason it has none."""
    index = int(device.rsplit(":", 1)[1])
    if backend_name() == "jax":
        import jax

        kind = "gpu" if ":GPU:" in device else "cpu"
        stats = jax.devices(kind)[index].memory_stats()
        if not stats:
            return f"JAX's {kind} device reports no memory_stats()"
        return stats["bytes_in_use"], stats["peak_bytes_in_use"]
    import tensorflow as tf

    try:
        info = tf.config.experimental.get_memory_info(
            device.replace("/device:", ""))
    except ValueError as error:
        return f"TensorFlow reports no memory info for {device} ({error})"
    if ":GPU:" not in device and not info["peak"]:
        # Its default CPU allocator counts nothing: 0 and 0, not a measure.
        return (f"TensorFlow's CPU allocator reports no statistics for "
                f"{device} (get_memory_info: {info})")
    return info["current"], info["peak"]


def _reset_peak(device):
    """Resets TensorFlow's peak of a GPU; JAX has none to reset (its row runs first)."""
    if backend_name() == "tensorflow" and ":GPU:" in device:
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats(device.replace("/device:", ""))


def memory_plan(context):
    """`memory_plan(model, batch)` against the first device's measured peak."""
    import multigpu

    started = time.perf_counter()
    size, device = context.size, context.devices[0]
    _reset_peak(device)
    before = _memory_stats(device)
    model = parallel(size, context.start)
    plan = multigpu.memory_plan(model, size["batch"], optimizer="sgd")
    if isinstance(before, str):
        # The plan is made all the same; only the measurement is missing.
        return row("memory_plan", "skipped", context.describe(), started,
                   reason=f"no GPU: {before}", plan_bytes=plan["total"],
                   tolerance=list(MEMORY_BAND), tolerance_source=MEMORY_SOURCE,
                   summary=f"plan {plan['total'] / 2**20:.2f} MiB per device; "
                           "nothing to measure it against")
    Trained(model, context.x[:size["batch"]], context.y[:size["batch"]],
            size["batch"])
    in_use, peak = _memory_stats(device)
    # JAX's peak is the process's: this row runs first, before any other
    # model trains, and what was in use before it is taken off.
    measured = peak - before[0]
    ratio = plan["total"] / max(measured, 1)
    low, high = MEMORY_BAND
    return row("memory_plan", "ok" if low <= ratio <= high else "differs",
               context.describe(), started, plan_bytes=plan["total"],
               measured_peak_bytes=measured, plan_over_measured=ratio,
               tolerance=list(MEMORY_BAND), tolerance_source=MEMORY_SOURCE,
               summary=f"plan {plan['total'] / 2**20:.1f} MiB, measured peak "
                       f"{measured / 2**20:.1f} MiB: {ratio:.2f}x")


def _is_out_of_memory(error):
    return "RESOURCE_EXHAUSTED" in str(error) or type(error).__name__ in (
        "ResourceExhaustedError",)


def find_batch_size_oom(context):
    """`find_batch_size`, then a real out-of-memory step and the memory after."""
    import multigpu

    started = time.perf_counter()
    size = context.size
    if not has_gpu():
        # The call path all the same, with a memory given: 64 MiB.
        given = 64 * 2**20
        model = parallel(size, context.start)
        batch = multigpu.find_batch_size(model, device_memory=given,
                                         optimizer="sgd")
        fits = multigpu.memory_plan(model, batch, optimizer="sgd",
                                    device_memory=given).fits
        return row("find_batch_size_oom", "skipped", context.describe(),
                   started, reason="no GPU: CPU devices have no device memory "
                   "limit to exhaust", device_memory=given, batch=batch,
                   plan_fits=fits, tolerance=LEAK_SLACK_BYTES,
                   tolerance_source=LEAK_SOURCE,
                   summary=f"find_batch_size(device_memory=64 MiB) = {batch}, "
                           f"plan fits: {fits}")
    return _oom_on_gpu(context, started)


def _oom_model(width=8192):
    """Few inputs, wide layers: a batch that exhausts a GPU is small on the host."""
    import keras

    inputs = keras.Input((8,))
    x = keras.layers.Dense(width, activation="relu")(inputs)
    x = keras.layers.Dense(width, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="oom_mlp")


def _oom_on_gpu(context, started):
    import keras

    import multigpu

    device = context.devices[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = multigpu.multi_gpu_model(_oom_model(), gpus=None)
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE),
                  loss="sparse_categorical_crossentropy",
                  jit_compile=default_jit())
    batch = multigpu.find_batch_size(model, optimizer="sgd")
    rng = np.random.default_rng(0)

    def batch_of(rows):
        return (rng.standard_normal((rows, 8), dtype=np.float32),
                rng.integers(0, 10, rows, dtype=np.int32))

    model.train_on_batch(*batch_of(len(context.devices)))  # builds SGD
    gc.collect()
    before = _memory_stats(device)[0]
    error = None
    try:
        model.train_on_batch(*batch_of(OOM_FACTOR * batch))
    except Exception as caught:  # noqa: BLE001 - the error is the result
        # Its text only: the error's traceback holds the failed step's
        # frames, whose arrays would stay on the device and read as a leak.
        error = (f"{type(caught).__name__}: {str(caught)[:300]}",
                 _is_out_of_memory(caught))
    gc.collect()
    after = _memory_stats(device)[0]
    fits = True
    try:
        model.train_on_batch(*batch_of(batch))
    except Exception as caught:  # noqa: BLE001
        fits = f"{type(caught).__name__}: {str(caught)[:200]}"
    leak = after - before
    failed = error is not None and error[1]
    status = "ok" if failed and fits is True and leak <= LEAK_SLACK_BYTES \
        else "differs"
    return row("find_batch_size_oom", status, context.describe(), started,
               batch=batch, oom_batch=OOM_FACTOR * batch,
               oom_error=error[0] if error else None,
               bytes_in_use_before=before, bytes_in_use_after=after,
               leak_bytes=leak, batch_found_runs=fits,
               tolerance=LEAK_SLACK_BYTES, tolerance_source=LEAK_SOURCE,
               summary=f"batch {batch}; x{OOM_FACTOR}: "
                       f"{'RESOURCE_EXHAUSTED' if failed else 'no OOM'}; "
                       f"memory after - before {leak} B; batch found runs: "
                       f"{fits is True}")


def mixed(context, built, policy):
    """`policy` through `multi_gpu_model` beside float32, timed in turn."""
    started = time.perf_counter()
    plain = built.setdefault("float32", context.parallel())
    chosen = context.parallel(policy)
    seconds = paired.pair({"float32": plain.step, "mixed": chosen.step},
                          rounds=context.size["rounds"], warmup=1)
    # What the policy itself does, on one device: the parallel run's bar.
    alone = difference(context.one_device(policy), context.reference,
                       context.start)
    allowed, source = tolerance(context.spread, policy, alone)
    measured = difference(chosen, context.reference, context.start)
    times = {k: step_ms(v, context.size) for k, v in seconds.items()}
    ratio = paired.ratio("ratio", seconds["mixed"], seconds["float32"])
    return row(policy, verdict(measured, allowed), context.describe(), started,
               float32_ms_per_step=times["float32"],
               mixed_ms_per_step=times["mixed"], **ratio,
               loss_float32=context.reference.loss, loss_mixed=chosen.loss,
               optimizer=type(chosen.model.optimizer).__name__,
               difference=measured, one_device_difference=alone,
               tolerance=allowed,
               tolerance_source=source,
               summary=f"{times['mixed']:.2f} vs {times['float32']:.2f} "
                       f"ms/step ({ratio['ratio']:.2f}x); difference from "
                       f"float32 one device {measured:.1e}")


def _without_xla(context):
    """`(Trained, what it is)` without XLA: the engine's, or where it refuses,
    the plain model's on one device."""
    try:
        return context.parallel(jit_compile=False), "multi_gpu_model", None
    except ValueError as error:
        # The JAX engine always compiles its step (it refuses False).
        return (context.one_device(jit_compile=False),
                "plain Keras model, one device", str(error).split(". ")[0])


def xla(context):
    """`jit_compile=True` against not, both against one device's run."""
    started = time.perf_counter()
    with_xla = context.parallel(jit_compile=True)
    without, what, refusal = _without_xla(context)
    seconds = paired.pair({"xla": with_xla.step, "plain": without.step},
                          rounds=context.size["rounds"], warmup=1)
    allowed, source = tolerance(context.spread, "float32")
    measured = {k: difference(v, context.reference, context.start)
                for k, v in (("xla", with_xla), ("plain", without))}
    times = {k: step_ms(v, context.size) for k, v in seconds.items()}
    ratio = paired.ratio("ratio", seconds["xla"], seconds["plain"])
    return row("xla", verdict(max(measured.values()), allowed),
               context.describe(), started, without_xla=what,
               engine_refuses_no_xla=refusal,
               xla_ms_per_step=times["xla"], plain_ms_per_step=times["plain"],
               **ratio, difference=measured["xla"],
               plain_difference=measured["plain"], tolerance=allowed,
               tolerance_source=source,
               summary=f"XLA {times['xla']:.2f} vs {what} {times['plain']:.2f}"
                       f" ms/step ({ratio['ratio']:.2f}x); differences "
                       f"{measured['xla']:.1e}, {measured['plain']:.1e}")


def _link(devices):
    """The link name of `predict_step` for these devices (see the constants)."""
    if ":GPU:" not in devices[0]:
        return "host_memory"
    kind = _device_kind(devices[0])
    if "PCIe" in kind:
        return "pcie4"
    if "H100" in kind or "H200" in kind:
        return "nvlink4"
    if "A100" in kind:
        return "nvlink3"
    return DEFAULT_GPU_LINK


def scaling(context, built):
    """The engine's step on n devices against one device's at n x the rows."""
    from multigpu import placement
    from multigpu.insight import scaling as scaling_lib
    from multigpu.placement import traffic

    started = time.perf_counter()
    devices, size = context.devices, context.size
    if len(devices) < 2:
        return row("scaling", "skipped", context.describe(), started,
                   reason="one device: scaling needs several (no second GPU)",
                   tolerance=None, tolerance_source=SCALING_SOURCE,
                   summary="one device")
    engine = built.setdefault("float32", context.parallel())
    # Weak scaling, as the model assumes: one device trains one replica's
    # rows (the plain model, Keras's placement) in the same rounds.
    rows = size["batch"] // len(devices)
    one = compiled(build_model(size), context.start)
    x, y = context.x[:rows * size["steps"]], context.y[:rows * size["steps"]]
    single = Trained(one, x, y, rows)
    seconds = paired.pair({"engine": engine.step, "one": single.step},
                          rounds=size["rounds"], warmup=1)
    one_s = statistics.median(seconds["one"]) / size["steps"]
    many_s = statistics.median(seconds["engine"]) / size["steps"]
    ring = traffic.ring_allreduce_bytes(placement.gradient_bytes(engine.model),
                                        len(devices))
    link = _link(devices)
    predicted = scaling_lib.predict_step({d: (ring, ring) for d in devices},
                                         one_s, link, len(devices))
    efficiency = one_s / many_s
    model_efficiency = predicted.speedup / len(devices)
    return row("scaling", "ok", context.describe(), started,
               one_device_ms_per_step=1e3 * one_s,
               engine_ms_per_step=1e3 * many_s, rows_per_replica=rows,
               efficiency=efficiency, model_efficiency=model_efficiency,
               efficiency_over_model=efficiency / model_efficiency,
               ring_allreduce_bytes=ring, link=predicted.link,
               tolerance=None, tolerance_source=SCALING_SOURCE,
               summary=f"efficiency {efficiency:.2f} against the ring "
                       f"all-reduce model's {model_efficiency:.2f} on "
                       f"{predicted.link}")


def run_rows(size):
    """Every row, in `ROWS`'s order; the memory row before any training
    (JAX's peak is the process's)."""
    discovery, devices = device_discovery(size)
    context = Context(size, devices)
    built = {}
    rows = {"device_discovery": discovery,
            "memory_plan": memory_plan(context),
            "engine_vs_keras_fit": engine_vs_keras_fit(context, built),
            "find_batch_size_oom": find_batch_size_oom(context)}
    for policy in ("mixed_bfloat16", "mixed_float16"):
        rows[policy] = mixed(context, built, policy)
    rows["xla"] = xla(context)
    rows["scaling"] = scaling(context, built)
    return [rows[name] for name in ROWS]


def table(rows):
    """The rows as a Markdown table."""
    lines = ["| check | status | measured | tolerance (from) | s | device |",
             "|---|---|---|---|---:|---|"]
    for r in rows:
        status = r["status"] + (f": {r['reason']}" if "reason" in r else "")
        allowed = r.get("tolerance")
        if isinstance(allowed, float):
            allowed = f"{allowed:.1e}"
        source = r.get("tolerance_source", "")
        source = f"{allowed} ({source})" if allowed is not None else source
        lines.append(f"| {r['name']} | {status} | {r['summary']} | {source} "
                     f"| {r['seconds']:.1f} | {r['device']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    """Runs every row; prints the table and writes `--out`.

    Returns:
        0, or 1 when a row differs.

    Example:
    >>> main(["--small", "--out", "out/gpu-check.json"])
    0
    """
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.perf_counter()
    set_up_devices(args.devices)
    import keras

    size = SIZES["small" if args.small else "full"]
    rows = run_rows(size)
    result = {"rows": rows, "backend": backend_name(),
              "keras": keras.__version__, "small": args.small,
              "processor": processor(), "size": size,
              # On JAX none may be: the check runs where it is not installed.
              "tensorflow_imported": "tensorflow" in sys.modules,
              "seconds": time.perf_counter() - started}
    directory = os.path.dirname(args.out)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1, default=str)
    print(table(rows))
    return int(any(r["status"] == "differs" for r in rows))


if __name__ == "__main__":
    sys.exit(main())
