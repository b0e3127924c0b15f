"""What `multigpu.ScalingMonitor` costs per step, and its one-off baseline.

    python -m bench.monitor_cost --output docs/bench/monitor-cost

The monitor wraps the model's `train_function` for the length of a `fit`:
per step, two clock reads and three list appends around the call. For
each workload of `bench/models.py`, engine and device count, one compiled
model's steps are timed by `bench.paired`, on a repeated batch of the
workload's size:

* A, a step through the monitor's wrapper, and B, through the bare
  `train_function`: the ratio of their steps per round, its median and 95%
  interval; the null is a second monitor's wrapper (A's twin) against A.
  All are steps of the same model;
* **the wrapper alone**: the wrapper around a function that does nothing,
  net of calling that function directly: what the monitor adds to a step,
  free of the step's noise, in microseconds and in percent of a bare step;
* **the baseline**: the seconds the first monitored step spent training the
  one-device copy (`ScalingMonitor.baseline_cost_seconds`, with the default
  5 timed steps), once per `fit`, and how many bare steps that is.
"""

import statistics
import sys

from bench import models, paired

# Calls of the wrapper per timing of the wrapper alone.
CALLS = 1000


def _model(workload, devices, engine):
    """A compiled model: `multi_gpu_model`, or Keras under a strategy."""
    import keras

    import multigpu

    if engine != "strategy":
        weights = models.build_model(workload).get_weights()
        return models.parallel_copy(workload, weights, devices, engine=engine)
    with multigpu.mirrored_strategy(devices).scope():
        model = models.build_model(workload)
        model.compile(optimizer=keras.optimizers.SGD(1e-3),
                      loss="sparse_categorical_crossentropy")
    return model


def _wrapper_alone(rounds):
    """Seconds the monitor's wrapper adds to a call, per call, net of it."""
    import multigpu

    def nothing(iterator):
        return iterator

    wrapped = multigpu.ScalingMonitor(baseline_steps=0)._timed(nothing)
    wrapped([])   # the first call keeps the batch; the wrapper's path after it

    def calls(function):
        def run():
            for _ in range(CALLS):
                function(None)
        return run

    seconds = paired.pair({"wrapped": calls(wrapped), "bare": calls(nothing)},
                          rounds)
    return [(a - b) / CALLS
            for a, b in zip(seconds["wrapped"], seconds["bare"], strict=True)]


def _arms(case, devices):
    import keras

    import multigpu

    keras.utils.set_random_seed(0)
    x, y = models.one_batch(case["workload"])
    model = _model(case["workload"], devices, case["engine"])
    model.make_train_function()
    bare = model.train_function
    monitors = []

    def monitored():
        monitor = multigpu.ScalingMonitor(warn=False)
        monitor.set_model(model)
        monitor.on_train_begin()
        monitors.append(monitor)
        step = paired.train_step(model, x, y)   # through the wrapper
        model.train_function = bare
        return step

    def after(seconds):
        # The warm-up's first monitored step measured the baseline.
        bare_ms = paired.milliseconds(seconds["b"])
        alone_us = 1e6 * statistics.median(
            _wrapper_alone(max(len(seconds["b"]) // 10, 10)))
        baseline = monitors[0].baseline_cost_seconds
        return {"wrapper_alone_us": alone_us,
                "wrapper_alone_percent": 100 * alone_us / 1e3 / bare_ms,
                "baseline_seconds": baseline,
                "baseline_steps_equivalent": 1e3 * baseline / bare_ms}

    return paired.Arms(a=monitored, b=lambda: paired.train_step(model, x, y),
                       cells={"batch_size": len(x)}, after=after)


STUDY = paired.Study(
    name="monitor_cost", a="monitored", b="bare", arms=_arms, rounds=200,
    axes=(paired.Axis("--workloads", "workload", ("demo", "mnist_cnn"),
                      tuple(models.WORKLOADS)),
          paired.Axis("--engines", "engine",
                      ("replicate", "mirrored", "strategy"))),
    tables=((paired.text("workload"), paired.text("engine"),
             paired.number("devices", "{devices}"),
             paired.number("bare step (ms)", "{bare_ms:.2f}"),
             paired.number("monitored step (ms)", "{monitored_ms:.2f}"),
             paired.interval("monitored / bare: median [95% interval]",
                             "ratio"),
             paired.interval("monitored twin / monitored (the null)", "null"),
             paired.number("wrapper alone (µs)", "{wrapper_alone_us:.2f}"),
             paired.number("wrapper alone, % of a step",
                           "{wrapper_alone_percent:.3f}%"),
             paired.number("baseline, once per fit (s)",
                           "{baseline_seconds:.2f}"),
             paired.number("baseline, in bare steps",
                           "{baseline_steps_equivalent:.0f}")),))


def main(argv=None):
    return paired.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
