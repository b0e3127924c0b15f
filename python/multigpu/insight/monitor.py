"""Is it faster: a callback that measures multi-device training while it runs.

`ScalingMonitor` times every step of `fit` and, on the first step, trains a
one-device copy of the model on the same batch for a few steps: the
baseline. From both it gives the samples per second, the speed-up over one
device, the efficiency (speed-up per device) and a warning when one device
would be faster.

How the time is measured. Keras's `fit` calls `model.train_function` once
per step; the monitor registers its `"monitor"` link of the train function
(`multigpu.step.train_function`) at `on_train_begin` and removes it at
`on_train_end`, so it sees when each step starts and returns and nothing
else changes. Its own per-step cost is two clock reads and three list
appends, published in docs/benchmarks.md.
"""

import itertools
import math
import statistics
import time
import warnings

import keras
import numpy as np

from multigpu import arguments, backends, messages, runtime
from multigpu import devices as devices_lib
from multigpu.engines.compiled import fresh_optimizer
from multigpu.insight import scaling
from multigpu.step import train_function as chain
from multigpu.variables import variable_bytes

SUMMARY_KEYS = (
    "devices", "engine", "batch_size", "steps", "samples_per_second",
    "step_seconds", "compute_seconds", "communication_seconds",
    "input_wait_seconds", "host_seconds", "baseline_samples_per_second",
    "baseline_step_seconds", "speedup", "efficiency", "notes",
)


def _devices_and_engine(model):
    """The devices `model` trains on and how: engine, strategy or one device."""
    devices = getattr(model, "devices", None)
    if devices is not None and hasattr(model, "template"):
        if backends.is_jax():
            return list(devices), model.engine
        engine = "mirrored" if hasattr(model, "strategy") else "replicate"
        return list(devices), engine
    strategy = getattr(model, "distribute_strategy", None)
    replicas = getattr(strategy, "num_replicas_in_sync", 1)
    if replicas > 1:  # only TensorFlow's strategies have several
        return list(strategy.extended.worker_devices), "strategy"
    available = devices_lib.available_devices()
    return [(available["GPU"] or available["CPU"])[0]], "single"


def _local_batch(model, data):
    """A batch drawn by `fit` as plain tensors (one strategy's parts joined).

    On TensorFlow only: its iterators and strategies (`_first_step`).
    """
    tf = runtime.loaded_tensorflow()
    strategy = getattr(model, "distribute_strategy", None)

    def joined(value):
        if isinstance(value, tf.distribute.DistributedValues):
            parts = strategy.experimental_local_results(value)
            return tf.concat(list(parts), axis=0)
        return value

    return tf.nest.map_structure(joined, data)


def _rows(batch):
    first = keras.tree.flatten(batch)[0]
    return int(first.shape[0])


def _block(result):
    """`result` once computed (`runtime.of_backend().wait`)."""
    return runtime.of_backend().wait(result)


def _tensorflow_iterator(iterator):
    """Whether `iterator` is a `tf.data` or `tf.distribute` iterator."""
    tf = runtime.loaded_tensorflow()
    return tf is not None and isinstance(
        iterator, (tf.data.Iterator, tf.distribute.DistributedIterator))


def _median(values):
    return statistics.median(values) if values else None


class ScalingMonitor(keras.callbacks.Callback):
    """Measures throughput and scaling efficiency during `fit`.

    Pass it to `fit` of a model that trains on several devices: one from
    `multi_gpu_model` (either engine) or one built under
    `mirrored_strategy()`. During the fit it measures:

    * **samples per second**: the rows of a batch over the median time
      from one step's start to the next's (Keras's loop and the other
      callbacks included: what `fit` delivers);
    * **the step time** (`step_seconds`): the median time inside the
      training step. Its split:

      - `host_seconds`: the median time between steps, outside the step
        (Keras's loop, progress bar, other callbacks): measured;
      - `communication_seconds`: between logical CPU devices TensorFlow
        passes references, so no copy is made and this is 0. On GPUs the
        transfers run inside the compiled step, where no callback can time
        them: it is None, unless `link` is given, then estimated from the
        bytes the engine moves per step (`multigpu.insight.scaling`: the replicate
        engine's first device sends the weights and receives the gradients
        of every other device, an all-reduce moves `2 (n - 1) / n` copies)
        over that link's bandwidth;
      - `compute_seconds`: the step time minus the communication, when
        that is known;
      - `input_wait_seconds`: always None. Keras on TensorFlow draws the
        batch inside the compiled step, so waiting for input is part of
        the step time and cannot be told apart from a callback (a slow
        input pipeline shows as a step slower than the baseline's, which
        trains on a batch held in memory).

      On GPUs a step may return before its kernels finish; the samples
      per second stay right, the split is then approximate.
    * **the one-device baseline**: on the first step, the batch `fit` drew
      is kept and a copy of the model (the template of an engine's model)
      is built on the first device with the same weights, loss and a fresh
      copy of the optimizer; it trains `baseline_steps` steps on that batch
      (after one step to trace), timed like the real steps. The user's
      model, weights and optimizer are not touched. Then `speedup` is the
      baseline's step time over the measured one, and `efficiency` the
      speed-up per device (1 is perfect scaling at a fixed global batch).

    When one device would be faster (speed-up below 1), it warns once per
    `fit`, at the end of the first epoch with enough measured steps (or
    when training ends).

    On JAX (a model from `multi_gpu_model`, the JAX engine) the monitor
    waits for each step's results before reading the clock, since JAX
    returns from a step before it ends; the collectives run inside the
    step XLA compiled, so `communication_seconds` is None unless `link` is
    given, and the baseline is a copy trained by Keras's step on the first
    device.

    Args:
        baseline_steps: Timed steps of the one-device copy, an int >= 1
            (0 skips the baseline: no speed-up, efficiency or warning).
        warmup_steps: Steps at the start of `fit` left out of the
            measurements (the first traces the step function), an int >= 1.
        link: None, or a name of `multigpu.insight.scaling.LINKS` (`"pcie4"`,
            `"nvlink3"`, `"nvlink4"`) to estimate the communication time
            on GPUs.
        warn: Whether to warn when one device would be faster.

    Example:
    >>> monitor = multigpu.ScalingMonitor()
    >>> parallel.fit(x, y, batch_size=256, epochs=2, callbacks=[monitor])
    >>> monitor.summary()["efficiency"]
    0.8...
    >>> monitor.plot()
    """

    def __init__(self, baseline_steps=5, warmup_steps=2, link=None, warn=True):
        super().__init__()
        self.baseline_steps = arguments.check_int(
            "baseline_steps", baseline_steps, 0,
            "the timed steps of the one-device baseline, an int >= 0 (0 "
            "skips it)")
        self.warmup_steps = arguments.check_int(
            "warmup_steps", warmup_steps, 1)
        if link is not None and link not in scaling.LINKS:
            raise ValueError(
                f"Invalid `link`: received {messages.literal(link)}; expected "
                f"{messages.literal(None)} or one of "
                f"{messages.literals(sorted(scaling.LINKS))}.")
        self.link = link
        self.warn = arguments.check_flag("warn", warn)
        self._starts, self._ends, self._epochs = [], [], []
        self._reset()

    def _reset(self):
        # Emptied, not replaced: the link made by `_timed` holds these.
        for values in (self._starts, self._ends, self._epochs):
            values.clear()
        self._epoch = 0
        self._rows = None
        self._baseline_seconds = None
        self._baseline_cost = None
        self._baseline_problem = None
        self._warned = False
        self._devices, self._engine = [], None
        self._pending_batch = None

    # --- Keras hooks -------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._reset()
        self._devices, self._engine = _devices_and_engine(self.model)
        chain.link(self.model, "monitor", self._timed)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._pending_batch is not None:
            self._jax_baseline()

    def on_epoch_end(self, epoch, logs=None):
        self._maybe_warn(final=False)

    def on_train_end(self, logs=None):
        chain.unlink(self.model, "monitor")
        self._maybe_warn(final=True)

    # --- measuring ---------------------------------------------------------

    def _timed(self, original):
        """The `"monitor"` link: `original`, timed."""
        clock = time.perf_counter
        starts, ends, epochs = self._starts, self._ends, self._epochs

        # TensorFlow's trainer calls `train(iterator)`, JAX's
        # `train(state, iterator)`: the iterator comes last.
        def train(*args):
            if not starts:
                return self._first_step(original, args)
            starts.append(clock())
            logs = _block(original(*args))
            ends.append(clock())
            epochs.append(self._epoch)
            return logs

        return train

    def _first_step(self, original, args):
        """The first step: keeps its batch, then measures the baseline."""
        steps = max(int(getattr(self.model, "steps_per_execution", 1) or 1), 1)
        start = time.perf_counter()
        *state, iterator = args
        if backends.is_jax():
            batches = list(itertools.islice(iterator, steps))
            if not batches:
                raise StopIteration
            logs = _block(original(*state, iter(batches)))
            batch = batches[0]
        elif _tensorflow_iterator(iterator):
            tf = runtime.loaded_tensorflow()
            batches = []
            for _ in range(steps):
                try:
                    batches.append(_local_batch(self.model, next(iterator)))
                except (StopIteration, tf.errors.OutOfRangeError):
                    break
            if not batches:
                raise StopIteration
            logs = original(self._same_kind(iterator, batches))
            batch = batches[0]
        else:
            logs = original(iterator)
            batch = None
        self._starts.append(start)
        self._ends.append(time.perf_counter())
        self._epochs.append(self._epoch)
        if batch is not None:
            self._rows = _rows(batch)
            if backends.is_jax():
                # During a step Keras's JAX trainer holds the weights
                # itself: the copy is made once the step has ended.
                self._pending_batch = batch
            elif self.baseline_steps and len(self._devices) > 1:
                cost = time.perf_counter()
                self._measure_baseline(batch)
                self._baseline_cost = time.perf_counter() - cost
        return logs

    def _same_kind(self, iterator, batches):
        """An iterator like `fit`'s over the batches drawn from it (TensorFlow's)."""
        tf = runtime.loaded_tensorflow()
        dataset = tf.data.Dataset.from_tensors(batches[0])
        for batch in batches[1:]:
            dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
        if isinstance(iterator, tf.distribute.DistributedIterator):
            strategy = self.model.distribute_strategy
            return iter(strategy.experimental_distribute_dataset(dataset))
        return iter(dataset)

    def _measure_baseline(self, batch):
        if backends.is_jax():
            self._measure_jax_baseline(batch)
            return
        tf = runtime.loaded_tensorflow()  # the backend: imported
        model = self.model
        template = getattr(model, "template", model)
        try:
            with runtime.of_backend().device_scope(self._devices[0]):
                copy = keras.models.clone_model(template)
                if copy.distribute_strategy.num_replicas_in_sync != 1:
                    raise ValueError(
                        "the copy was created under a strategy's scope, so on "
                        "several devices")
                copy.set_weights(template.get_weights())
                copy.compile(optimizer=fresh_optimizer(model.optimizer),
                             loss=model.loss)
                copy.make_train_function()
                iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
                seconds = []
                for i in range(self.baseline_steps + 1):
                    start = time.perf_counter()
                    logs = copy.train_function(iterator)
                    for value in keras.tree.flatten(logs):
                        value.numpy()
                    if i:
                        seconds.append(time.perf_counter() - start)
            self._baseline_seconds = statistics.median(seconds)
        except (ValueError, TypeError, NotImplementedError) as error:
            self._no_baseline(error)

    def _jax_baseline(self):
        """Measures the baseline on JAX, after the first step ended.

        Keras's JAX trainer keeps the weights out of the model's variables
        during `fit`; `jax_state_sync` (Keras's way for callbacks) puts
        them back, so the copy starts from the trained weights.
        """
        batch, self._pending_batch = self._pending_batch, None
        if self.baseline_steps and len(self._devices) > 1:
            cost = time.perf_counter()
            self.model.jax_state_sync()
            self._measure_baseline(batch)
            self._baseline_cost = time.perf_counter() - cost

    def _no_baseline(self, error):
        """Says why the one-device baseline could not be measured."""
        self._baseline_problem = (
            f"no one-device baseline: the model could not be copied or "
            f"trained alone ({type(error).__name__}: {error})")

    def _measure_jax_baseline(self, batch):
        """`_measure_baseline` on JAX: Keras's step on the first device.

        The copy trains one step by `train_on_batch` (which builds its
        optimizer and traces the step), then `baseline_steps` timed steps
        through its train function, as `fit` calls it on JAX.
        """
        model = self.model
        template = getattr(model, "template", model)
        try:
            with runtime.of_backend().device_scope(self._devices[0]):
                batch = keras.tree.map_structure(
                    lambda a: a if a is None else np.asarray(a), batch)
                copy = keras.models.clone_model(template)
                copy.set_weights(template.get_weights())
                copy.compile(optimizer=fresh_optimizer(model.optimizer),
                             loss=model.loss)
                x, y, weights = keras.utils.unpack_x_y_sample_weight(batch)
                copy.train_on_batch(x, y, sample_weight=weights)
                # As `train_on_batch` gave it: the step traced there runs.
                batch = (x, y, weights)
                state = tuple(
                    [v.value for v in variables] for variables in (
                        copy.trainable_variables,
                        copy.non_trainable_variables,
                        copy.optimizer.variables, copy.metrics_variables))
                seconds = []
                for i in range(self.baseline_steps + 1):
                    start = time.perf_counter()
                    _, state = _block(copy.train_function(state, iter([batch])))
                    if i:
                        seconds.append(time.perf_counter() - start)
            self._baseline_seconds = statistics.median(seconds)
        except (ValueError, TypeError, NotImplementedError) as error:
            self._no_baseline(error)

    def _measured(self):
        """Step and period seconds of the steps after the warm-up."""
        calls, periods = [], []
        for i in range(self.warmup_steps, len(self._starts)):
            calls.append(self._ends[i] - self._starts[i])
            following = i + 1
            if (following < len(self._starts)
                    and self._epochs[following] == self._epochs[i]):
                periods.append(self._starts[following] - self._starts[i])
        return calls, periods

    # --- results -----------------------------------------------------------

    def _communication(self, step_seconds):
        devices = self._devices
        n = len(devices)
        if n < 2:
            return 0.0
        if not backends.is_jax() and all(":CPU:" in d.upper() for d in devices):
            return 0.0
        if self.link is None or not step_seconds:
            return None
        template = getattr(self.model, "template", self.model)
        gradient = sum(variable_bytes(v) for v in template.trainable_variables)
        per_device = ((n - 1) * gradient if self._engine == "replicate"
                      else 2 * (n - 1) / n * gradient)
        traffic = {d: (per_device, per_device) for d in devices}
        return scaling.predict_step(traffic, step_seconds, self.link, n).comm_seconds

    def summary(self):
        """What was measured so far, as a dict.

        Returns:
            A dict with `devices` (their number), `engine` (`"replicate"`,
            `"mirrored"`, `"strategy"` or `"single"`), `batch_size` (rows
            per step), `steps` (measured), `samples_per_second`,
            `step_seconds`, `compute_seconds`, `communication_seconds`,
            `input_wait_seconds`, `host_seconds`,
            `baseline_samples_per_second`, `baseline_step_seconds`,
            `speedup`, `efficiency` (None for what was not measured or
            cannot be) and `notes`, sentences saying what is missing and
            why.

        Example:
        >>> monitor.summary()["samples_per_second"]
        5120.3...
        """
        calls, periods = self._measured()
        step = _median(calls)
        period = _median(periods)
        rows = self._rows
        notes = []
        samples = rows / period if rows and period else None
        if not periods:
            notes.append(
                f"Fewer than {self.warmup_steps + 2} steps in an epoch so far: "
                "no throughput yet (the first steps are warm-up).")
        communication = self._communication(step)
        if communication is None:
            where = ("Communication (XLA's all-reduces) runs inside the "
                     "compiled step" if backends.is_jax() else
                     "Communication runs inside the compiled step on GPUs")
            notes.append(
                f"{where} and is "
                "not measured; give link to estimate it from the bytes moved.")
        elif self._devices and all(":CPU:" in d.upper() for d in self._devices):
            notes.append("Logical CPU devices pass tensors by reference: no "
                         "communication time.")
        notes.append("Waiting for input is not measured: Keras draws each "
                     "batch inside the compiled step.")
        baseline = self._baseline_seconds
        if self._baseline_problem:
            notes.append(self._baseline_problem + ".")
        elif len(self._devices) < 2:
            notes.append("The model trains on one device: no baseline.")
        elif baseline is None and self.baseline_steps:
            notes.append("No baseline yet: it is measured on the first step.")
        speedup = baseline / step if baseline and step else None
        return {
            "devices": len(self._devices),
            "engine": self._engine,
            "batch_size": rows,
            "steps": len(calls),
            "samples_per_second": samples,
            "step_seconds": step,
            "compute_seconds": (step - communication
                                if step is not None and communication is not None
                                else None),
            "communication_seconds": communication,
            "input_wait_seconds": None,
            "host_seconds": (max(period - _median(calls[:len(periods)]), 0.0)
                             if period else None),
            "baseline_samples_per_second": rows / baseline if rows and baseline else None,
            "baseline_step_seconds": baseline,
            "speedup": speedup,
            "efficiency": speedup / len(self._devices) if speedup else None,
            "notes": notes,
        }

    def history(self):
        """Every measured step: a dict of lists.

        Returns:
            `{"step": [...], "epoch": [...], "seconds": [...],
            "samples_per_second": [...]}`, one entry per step after the
            warm-up (seconds inside the step; samples per second from it).
        """
        steps = list(range(self.warmup_steps, len(self._starts)))
        seconds = [self._ends[i] - self._starts[i] for i in steps]
        rows = self._rows or math.nan
        return {
            "step": steps,
            "epoch": [self._epochs[i] for i in steps],
            "seconds": seconds,
            "samples_per_second": [rows / s if s > 0 else math.nan for s in seconds],
        }

    @property
    def baseline_cost_seconds(self):
        """Seconds the one-device baseline took in the first step, or None."""
        return self._baseline_cost

    def _maybe_warn(self, final):
        if self._warned or not self.warn:
            return
        calls, _ = self._measured()
        if len(calls) < 3 and not final:
            return
        result = self.summary()
        if result["speedup"] is None:
            return
        self._warned = True
        if result["speedup"] < 1:
            n = result["devices"]
            warnings.warn(
                f"One device would be faster: a step took "
                f"{1e3 * result['step_seconds']:.1f} ms on {n} devices and "
                f"{1e3 * result['baseline_step_seconds']:.1f} ms on one "
                f"(speed-up {result['speedup']:.2f}, efficiency "
                f"{result['efficiency']:.2f}). Give each device more rows "
                "(a larger batch), or train on fewer devices.",
                UserWarning, stacklevel=2)

    def plot(self, ax=None):
        """Draws the measured throughput per step against the baseline.

        Args:
            ax: A matplotlib `Axes`, or None for a new figure.

        Returns:
            The `Axes` (see `multigpu.insight.plotting.plot_scaling`).
        """
        from multigpu.insight.plotting import plot_scaling

        return plot_scaling(self, ax=ax)
