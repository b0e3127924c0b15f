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

import math
import statistics
import time
import warnings

import keras

from multigpu import arguments, messages, runtime
from multigpu import devices as devices_lib
from multigpu.engines.compiled import fresh_optimizer
from multigpu.engines.copies import copy_model
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
        # Each engine's model names its engine; `model_parallel`'s stages
        # on TensorFlow place like the replicate engine.
        return list(devices), getattr(model, "engine", "replicate")
    strategy = getattr(model, "distribute_strategy", None)
    replicas = getattr(strategy, "num_replicas_in_sync", 1)
    if replicas > 1:  # only TensorFlow's strategies have several
        return list(strategy.extended.worker_devices), "strategy"
    available = devices_lib.available_devices()
    return [(available["GPU"] or available["CPU"])[0]], "single"


def _rows(batch):
    first = keras.tree.flatten(batch)[0]
    return int(first.shape[0])


def _block(result):
    """`result` once computed (`runtime.of_backend().wait`)."""
    return runtime.of_backend().wait(result)


def _median(values):
    return statistics.median(values) if values else None


def _check_one_device(copy):
    """Refuses a copy made under a strategy's scope (so on several devices)."""
    strategy = getattr(copy, "distribute_strategy", None)
    if getattr(strategy, "num_replicas_in_sync", 1) != 1:
        raise ValueError(
            "the copy was created under a strategy's scope, so on "
            "several devices")


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
            self._baseline_after_step()

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
        logs, batch = runtime.of_backend().first_step(
            original, args, steps,
            getattr(self.model, "distribute_strategy", None))
        self._starts.append(start)
        self._ends.append(time.perf_counter())
        self._epochs.append(self._epoch)
        if batch is not None:
            self._rows = _rows(batch)
            if runtime.of_backend().holds_weights_in_step():
                # The trainer holds the weights itself during the step:
                # the copy is made once the step has ended.
                self._pending_batch = batch
            elif self.baseline_steps and len(self._devices) > 1:
                cost = time.perf_counter()
                self._measure_baseline(batch)
                self._baseline_cost = time.perf_counter() - cost
        return logs

    def _measure_baseline(self, batch):
        """Times a one-device copy of the model training on `batch`.

        The copy (`copies.copy_model`, the engines' maker of copies) starts
        from the template's weights and state, with a fresh optimizer of
        the model's config; the backend's runtime runs and times its steps
        as `fit` would (`time_steps`).
        """
        model = self.model
        template = getattr(model, "template", model)
        try:
            with runtime.of_backend().device_scope(self._devices[0]):
                copy = copy_model(template)
                _check_one_device(copy)
                copy.compile(optimizer=fresh_optimizer(model.optimizer),
                             loss=model.loss)
                seconds = runtime.of_backend().time_steps(
                    copy, batch, self.baseline_steps)
            self._baseline_seconds = statistics.median(seconds)
        except (ValueError, TypeError, NotImplementedError) as error:
            self._no_baseline(error)

    def _baseline_after_step(self):
        """Measures the baseline once the first step ended.

        Where the trainer keeps the weights out of the model's variables
        during `fit` (Keras on JAX), `sync_weights` puts them back first,
        so the copy starts from the trained weights.
        """
        batch, self._pending_batch = self._pending_batch, None
        if self.baseline_steps and len(self._devices) > 1:
            cost = time.perf_counter()
            runtime.of_backend().sync_weights(self.model)
            self._measure_baseline(batch)
            self._baseline_cost = time.perf_counter() - cost

    def _no_baseline(self, error):
        """Says why the one-device baseline could not be measured."""
        self._baseline_problem = (
            f"no one-device baseline: the model could not be copied or "
            f"trained alone ({type(error).__name__}: {error})")

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
        if runtime.of_backend().communication_free(devices):
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
            where = runtime.of_backend().where_communication_runs()
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
