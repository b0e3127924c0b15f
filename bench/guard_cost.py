"""What the NaN/inf guard of the engines' training step costs per step.

    python -m bench.guard_cost --output docs/bench/guard-cost

The engines' training step checks every floating-point tensor of its
share of the batch for NaN and inf, and every write of the step (the
update, the captured writes of the forward pass, the metrics) waits for
one assertion that every share was finite; the forward pass and the
gradients run beside the check (`multigpu.step.train_step`). For each
workload of `bench/models.py`, engine and device count, `bench.paired`
takes training steps in turn of models of the same template and weights:

* A, guarded (`check_finite=True`), and B, unguarded: the ratio of their
  steps per round, its median and 95% interval; the null is A's twin
  against A, what "no cost" measures in this run;
* **the guard alone**: `multigpu.step.guard.check` of the same batch and
  identities of what it passes on, in a `tf.function` of its own, paired
  with the same function without it (identities only) and net of it: what
  the check's ops cost without the step around them, free of most of the
  step's noise.

The cost in percent of a step is `(guarded / unguarded - 1) x 100` from the
paired steps, and `guard alone / unguarded step x 100`.
"""

import statistics
import sys

from bench import models, paired


def _guard_alone(x, y, rounds):
    """Seconds the guard's ops take on `(x, y)`, per call, net of the call.

    The call and fetch overheads of a function, which a training step pays
    once anyway, cancel in the difference of each pair.

    Returns:
        A list of seconds, one per round.
    """
    import tensorflow as tf

    from multigpu.step import guard as guard_lib
    from multigpu.step import nonfinite

    def leaves(guard):
        @tf.function
        def function(x, y):
            checked = [t for _, t in nonfinite.checked_leaves(
                x, y, None, guard_lib.is_checked)]
            verdict = [guard_lib.check(checked)] if guard else []
            with tf.control_dependencies(verdict):
                return [tf.identity(t) for t in checked] or [tf.identity(x)]

        x_tensor, y_tensor = tf.constant(x), tf.constant(y)
        return lambda: [value.numpy() for value in function(x_tensor, y_tensor)]

    seconds = paired.pair({"guarded": leaves(True), "bare": leaves(False)},
                          rounds)
    return [a - b for a, b in zip(seconds["guarded"], seconds["bare"], strict=True)]


def _arms(case, devices):
    workload = case["workload"]
    x, y, weights = models.seeded_start(workload)

    def build(check_finite):
        def make():
            model = models.parallel_copy(workload, weights, devices,
                                         engine=case["engine"])
            model.check_finite = check_finite
            return paired.train_step(model, x, y)
        return make

    def alone(seconds):
        ms = 1e3 * statistics.median(_guard_alone(x, y, len(seconds["b"])))
        return {"guard_alone_ms": ms,
                "guard_alone_percent": 100 * ms / paired.milliseconds(seconds["b"])}

    return paired.Arms(a=build(True), b=build(False), after=alone,
                       cells={"batch_size": len(x)})


STUDY = paired.Study(
    name="guard_cost", a="on", b="off", arms=_arms, rounds=100,
    axes=(paired.Axis("--workloads", "workload", tuple(models.WORKLOADS),
                      tuple(models.WORKLOADS)),
          paired.Axis("--engines", "engine", ("replicate", "mirrored"))),
    tables=((paired.text("workload"), paired.text("engine"),
             paired.number("devices", "{devices}"),
             paired.number("step without guard (ms)", "{off_ms:.2f}"),
             paired.number("with guard (ms)", "{on_ms:.2f}"),
             paired.interval("guarded / unguarded: median [95% interval]",
                             "ratio"),
             paired.interval("guarded twin / guarded (the null)", "null"),
             paired.number("guard alone (ms)", "{guard_alone_ms:.3f}"),
             paired.number("guard alone, % of a step",
                           "{guard_alone_percent:.2f}%")),))


def main(argv=None):
    return paired.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
