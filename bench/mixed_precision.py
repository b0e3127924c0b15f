"""Mixed precision against float32, per training step, on each engine.

    python -m bench.mixed_precision --output docs/bench/mixed-precision
    python -m bench.mixed_precision --quick --output out/mixed-precision

For each workload, dtype policy (`mixed_float16`, `mixed_bfloat16`),
engine and device count, `bench.paired` takes training steps in turn of
two parallel models of the same template weights: A built under the
policy, B under `float32`. The policy is set
(`keras.config.set_dtype_policy`) before the template is built and
restored once the parallel model is compiled; the output layer is float32
in both (`dtype="float32"`), as the mixed-precision guides advise. Under
`mixed_float16` Keras's `compile` wraps the optimizer (Adam, 1e-3) in a
`LossScaleOptimizer`; under `mixed_bfloat16` it does not. Per round the
ratio A / B, its median and 95% interval, and the null: A's twin against A.

The engines: `replicate` and `mirrored` run in TensorFlow worker
processes, `jax` in JAX worker processes of their own (Keras picks its
backend once per process, at import). A TensorFlow step is one call of the
model's train function on a repeated batch (`paired.train_step`); a JAX
step is `train_on_batch` (the batch placed on the devices, the step, the
variables written back).

On CPUs these numbers are the cost of the plumbing: casts between float32
variables and float16 or bfloat16 computations, and under `mixed_float16`
the loss scale's multiply, unscale and finiteness check. CPUs have no
float16 matrix units, so nothing here shows what a GPU's tensor cores gain.

After the timed steps each model takes one more step, whose loss is
reported (A, its twin and B have then taken the same steps on the same
batch from the same weights), with A's final loss scale and the steps its
`LossScaleOptimizer` skipped (a gradient not finite), so a policy that
trains wrongly on an engine shows.
"""

import dataclasses
import json
import os
import subprocess
import sys

from bench import models, paired, report

POLICIES = ("mixed_float16", "mixed_bfloat16")
TENSORFLOW_ENGINES = ("replicate", "mirrored")
ENGINES = (*TENSORFLOW_ENGINES, "jax")

# name: (description, the `bench.models` data it trains on)
WORKLOADS = {
    "mlp": ("MLP 784-256-256-10 on synthetic rows", "mlp"),
    "cnn": ("CNN of 2 conv layers (16, 32 filters) and a 64-unit dense "
            "layer on synthetic 28x28x1 images", "mnist_cnn"),
}


def build_model(workload):
    """A fresh model of `workload` under the current dtype policy.

    Its output layer computes in float32 whatever the policy, so the
    softmax and the loss are float32 (numerically stable).

    Returns:
        A functional `keras.Model` with softmax outputs over 10 classes.
    """
    import keras

    layers = keras.layers
    if workload == "mlp":
        inputs = keras.Input((784,), name="features")
        x = layers.Dense(256, activation="relu")(inputs)
        x = layers.Dense(256, activation="relu")(x)
    else:
        inputs = keras.Input((28, 28, 1), name="image")
        x = layers.Conv2D(16, 3, activation="relu")(inputs)
        x = layers.MaxPooling2D()(x)
        x = layers.Conv2D(32, 3, activation="relu")(x)
        x = layers.MaxPooling2D()(x)
        x = layers.Flatten()(x)
        x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(models.NUM_CLASSES, activation="softmax",
                           dtype="float32", name="label")(x)
    return keras.Model(inputs, outputs, name=workload)


def parallel_model(workload, weights, devices, engine, policy):
    """`multi_gpu_model` of a fresh template built under `policy`, compiled.

    The global dtype policy is `policy` while the template is built, copied
    and compiled, and is restored afterwards.

    Args:
        workload: A key of `WORKLOADS`.
        weights: The template's weights (`get_weights()` of another build).
        devices: The devices.
        engine: `"replicate"`, `"mirrored"` or `"jax"` (the JAX backend's
            only engine).
        policy: A dtype policy's name, e.g. `"mixed_float16"`.

    Returns:
        The parallel model, compiled with Adam (1e-3) and sparse
        categorical cross-entropy.
    """
    import keras

    import multigpu

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        template = build_model(workload)
        template.set_weights(weights)
        options = {} if engine == "jax" else {"engine": engine}
        model = multigpu.multi_gpu_model(template, gpus=devices, **options)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss="sparse_categorical_crossentropy")
    finally:
        keras.config.set_dtype_policy(previous)
    return model


def _step(model, engine, x, y):
    """A step of `model` on `(x, y)`, and a function of its last loss.

    Returns:
        `(step, loss)`: `step()` takes one training step; `loss()` takes
        one more after resetting the metrics and returns its loss (the
        batch's, before that step's update).
    """
    if engine == "jax":
        return (lambda: model.train_on_batch(x, y),
                lambda: float(model.train_on_batch(x, y)))
    import tensorflow as tf

    # One step through Keras first, which builds the optimizer before the
    # train function is traced, as `fit` does (before f2ca2c6 the mirrored
    # engine's trace failed on a `LossScaleOptimizer` it had to build
    # itself: "You must feed a value for placeholder tensor").
    model.train_on_batch(x, y)
    # As `paired.train_step`, keeping the logs of the last step.
    model.make_train_function()
    function, logs = model.train_function, {}
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    strategy = model.distribute_strategy
    if strategy.num_replicas_in_sync > 1:
        dataset = strategy.experimental_distribute_dataset(dataset)
    iterator = iter(dataset)

    def step():
        logs.update({k: v.numpy() for k, v in function(iterator).items()})

    def loss():
        model.reset_metrics()
        step()
        return float(logs["loss"])

    return step, loss


def _loss_scale(optimizer):
    """The scale and the inner optimizer's updates, or NaN and `iterations`."""
    import numpy as np

    scale = getattr(optimizer, "dynamic_scale", None)
    scale = float("nan") if scale is None else float(np.asarray(scale))
    return scale, int(np.asarray(optimizer.iterations))


def _arms(case, devices):
    import keras

    workload, engine, policy = case["workload"], case["engine"], case["policy"]
    keras.utils.set_random_seed(0)
    x, y = models.load_data(WORKLOADS[workload][1], rows=case["batch"])
    weights = build_model(workload).get_weights()
    built = {"mixed": [], "float32": []}

    def build(name, chosen):
        def make():
            model = parallel_model(workload, weights, devices, engine, chosen)
            step, loss = _step(model, engine, x, y)
            built[name].append((model, loss))
            return step
        return make

    def after(seconds):
        # One more step of each model: the loss of the same batch after the
        # same steps from the same weights.
        (mixed, twin), (plain,) = built["mixed"], built["float32"]
        losses = [loss() for _, loss in (mixed, twin, plain)]
        scale, updates = _loss_scale(mixed[0].optimizer)
        steps = paired.WARMUP + len(seconds["a"]) + 1 + (engine != "jax")
        return {"loss_mixed": losses[0], "loss_twin": losses[1],
                "loss_float32": losses[2], "loss_scale": scale,
                "optimizer": type(mixed[0].optimizer).__name__,
                "skipped_steps": steps - updates}

    return paired.Arms(a=build("mixed", policy), b=build("float32", "float32"),
                       cells={"batch_size": len(x)}, after=after)


STUDY = paired.Study(
    name="mixed_precision", a="mixed", b="float32", arms=_arms, rounds=60,
    devices=(4,), environment={"KERAS_BACKEND": "tensorflow"},
    axes=(paired.Axis("--workloads", "workload", tuple(WORKLOADS),
                      tuple(WORKLOADS)),
          paired.Axis("--policies", "policy", POLICIES, POLICIES),
          paired.Axis("--engines", "engine", ENGINES, ENGINES)),
    options={"batch": 128},
    tables=((paired.text("workload"), paired.text("engine"),
             paired.text("policy"), paired.number("devices", "{devices}"),
             paired.number("float32 step (ms)", "{float32_ms:.2f}"),
             paired.number("mixed step (ms)", "{mixed_ms:.2f}"),
             paired.interval("mixed / float32: median [95% interval]",
                             "ratio"),
             paired.interval("mixed twin / mixed (the null)", "null"),
             paired.number("loss after: float32",
                           "{loss_float32:.4f}"),
             paired.number("mixed", "{loss_mixed:.4f}"),
             paired.Column("optimizer (loss scale, skipped steps)",
                           "{optimizer} ({loss_scale:g}, {skipped_steps})",
                           "---")),))

# The JAX engine's workers: the same study, on Keras's JAX backend.
JAX_STUDY = dataclasses.replace(STUDY, environment={"KERAS_BACKEND": "jax"})

# `--quick`: a smoke run (one small case per engine, seconds of timing).
QUICK = ("--devices", "2", "--rounds", "3", "--workloads", "mlp",
         "--policies", "mixed_float16", "--batch", "32")


def _split(engines):
    """`[(study, engines)]`: the TensorFlow engines, then the JAX engine."""
    tensorflow = [e for e in engines if e in TENSORFLOW_ENGINES]
    jax = [e for e in engines if e == "jax"]
    return [(study, chosen) for study, chosen in
            ((STUDY, tensorflow), (JAX_STUDY, jax)) if chosen]


def main(argv=None):
    """Runs the study: TensorFlow's workers, then JAX's, then the outputs.

    `--quick` stands for the options of `QUICK`.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--quick" in argv:
        argv.remove("--quick")
        argv = [*QUICK, *argv]
    parser = paired.argument_parser(STUDY)
    args = parser.parse_args(argv)
    if args.worker:
        # The parent chose the backend through the environment.
        return paired.main(STUDY, argv)
    paired.cases(STUDY, args, parser)   # reports unknown values
    engines = [e for e in args.engines.split(",") if e]
    rows, load_before = [], os.getloadavg()[0]
    for study, chosen in _split(engines):
        for count in [int(d) for d in args.devices.split(",") if d]:
            done = subprocess.run(
                [sys.executable, "-m", "bench.mixed_precision", *argv,
                 "--engines", ",".join(chosen), "--worker", str(count)],
                stdout=subprocess.PIPE, text=True, check=False,
                env=paired.worker_environment(study))
            if done.returncode:
                raise SystemExit(f"mixed_precision worker ({chosen}, {count} "
                                 "devices) failed")
            rows += json.loads(done.stdout.strip().splitlines()[-1])
    report.write_results(
        args.output, {"rows": rows, "load_1min_before": load_before,
                      "load_1min_after": os.getloadavg()[0]},
        paired.markdown(STUDY, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
