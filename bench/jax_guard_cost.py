"""What the JAX engine's NaN/inf guard costs per step.

    python -m bench.jax_guard_cost --output docs/bench/jax-guard-cost

On JAX the guard checks each training batch on the host before it is
placed on the devices (`multigpu.engines.jax.guard`). For each workload,
one process (`KERAS_BACKEND=jax`, 4 simulated CPU devices by default)
builds the same `multi_gpu_model` twice from the same weights, guarded
(`check_finite=True`, A) and not (B), and `bench.paired` times one epoch
of `fit` of each in turn (`--rows` rows in batches of `--batch`, in
order): the ratio of A's epoch to B's per round, its median and 95%
interval, against the null of B's twin. It also times the check alone
(`guard.findings` of one batch) and gives it in percent of an unguarded
step. On these CPUs the host and the devices share two cores, so the
check's time is not hidden behind the step as on a GPU, where the host is
idle while the devices compute.
"""

import statistics
import sys
import time

from bench import models, paired


def _compiled(model, weights):
    import keras

    model.set_weights(weights)
    model.compile(optimizer=keras.optimizers.SGD(1e-3),
                  loss="sparse_categorical_crossentropy")
    return model


def _arms(case, devices):
    import keras

    import multigpu
    from multigpu.engines.jax import guard

    workload, batch_size, rows = case["workload"], case["batch"], case["rows"]
    keras.utils.set_random_seed(0)
    x, y = models.load_data(workload)
    x, y = x[:rows], y[:rows]
    weights = models.build_model(workload).get_weights()

    def build(check_finite):
        def make():
            model = _compiled(multigpu.multi_gpu_model(
                models.build_model(workload), gpus=len(devices)), weights)
            model.check_finite = check_finite

            def epoch():
                model.fit(x, y, batch_size=batch_size, epochs=1,
                          shuffle=False, verbose=0)
            return epoch
        return make

    def alone(seconds):
        batch = (x[:batch_size], y[:batch_size])
        timings = []
        for _ in range(len(seconds["b"])):
            start = time.perf_counter()
            guard.findings(batch)
            timings.append(time.perf_counter() - start)
        steps = -(-rows // batch_size)
        step_ms = 1e3 * statistics.median(seconds["b"]) / steps
        check_ms = 1e3 * statistics.median(timings)
        return {"step_ms": step_ms, "guard_alone_ms": check_ms,
                "guard_alone_percent": 100 * check_ms / step_ms}

    return paired.Arms(a=build(True), b=build(False), after=alone,
                       cells={"batch_size": batch_size})


STUDY = paired.Study(
    name="jax_guard_cost", a="on", b="off", arms=_arms, rounds=40,
    devices=(4,), environment={"KERAS_BACKEND": "jax"},
    axes=(paired.Axis("--workloads", "workload", ("mlp", "mnist_cnn"),
                      ("mlp", "mnist_cnn")),
          paired.Axis("--batches", "batch", (128,), type=int)),
    options={"rows": 1024},
    tables=((paired.text("workload"), paired.number("batch", "{batch_size}"),
             paired.number("devices", "{devices}"),
             paired.number("epoch without guard (ms)", "{off_ms:.1f}"),
             paired.number("with guard (ms)", "{on_ms:.1f}"),
             paired.interval("guarded / unguarded: median [95% interval]",
                             "ratio"),
             paired.interval("guarded twin / guarded (the null)", "null"),
             paired.number("step without guard (ms)", "{step_ms:.2f}"),
             paired.number("guard alone per batch (ms)", "{guard_alone_ms:.3f}"),
             paired.number("guard alone, % of a step",
                           "{guard_alone_percent:.2f}%")),))


def main(argv=None):
    return paired.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
