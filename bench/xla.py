"""What XLA per replica (`compile(jit_compile=True)`) does to a training step.

    python -m bench.xla --output docs/bench/xla

With `jit_compile=True` the TensorFlow engines compile each replica's
forward pass and its gradient with XLA on the replica's device
(`multigpu.engines.tensorflow.device_pass.compiled_on`); the slicing, the
loss, the NaN/inf guard and the update around them run as without it.
For each workload of `bench/models.py`, engine and device count,
`bench.paired` takes training steps in turn of parallel models of the
same template and weights on a repeated batch: A with XLA, B without. Per
round the ratio of A's step to B's, its median and 95% interval, and the
null (A's twin against A).

Beside them, in the same rounds: the template itself on one device,
trained by plain Keras with `jit_compile=True` and without, so the table
also says what XLA does to one device's step on this machine.
"""

import sys

from bench import models, paired


def _arms(case, devices):
    workload = case["workload"]
    x, y, weights = models.seeded_start(workload)

    def build(jit_compile):
        def make():
            model = models.parallel_copy(workload, weights, devices,
                                         engine=case["engine"])
            model.jit_compile = jit_compile
            return paired.train_step(model, x, y)
        return make

    def plain(jit_compile):
        def make():
            import keras

            model = models.build_model(workload)
            model.set_weights(weights)
            model.compile(optimizer=keras.optimizers.SGD(1e-3),
                          loss="sparse_categorical_crossentropy",
                          jit_compile=jit_compile)
            return paired.train_step(model, x, y)
        return make

    return paired.Arms(a=build(True), b=build(False),
                       beside={"keras_xla": plain(True),
                               "keras": plain(False)},
                       cells={"batch_size": len(x)})


STUDY = paired.Study(
    name="xla", a="xla", b="plain", arms=_arms, rounds=60,
    axes=(paired.Axis("--workloads", "workload", ("demo", "mnist_cnn"),
                      tuple(models.WORKLOADS)),
          paired.Axis("--engines", "engine", ("replicate", "mirrored"))),
    tables=((paired.text("workload"), paired.text("engine"),
             paired.number("devices", "{devices}"),
             paired.number("step without XLA (ms)", "{plain_ms:.2f}"),
             paired.number("with XLA per replica (ms)", "{xla_ms:.2f}"),
             paired.interval("XLA / without: median [95% interval]",
                             "ratio"),
             paired.interval("XLA twin / XLA (the null)", "null"),
             paired.number("one device, Keras (ms)", "{keras_ms:.2f}"),
             paired.number("one device, Keras with XLA (ms)",
                           "{keras_xla_ms:.2f}")),))


def main(argv=None):
    return paired.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
