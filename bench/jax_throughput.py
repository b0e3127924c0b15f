"""Training throughput on JAX: multigpu's engine against Keras's DataParallel.

    python -m bench.jax_throughput --output docs/bench/jax-throughput
    python -m bench.jax_throughput --quick --output out/jax-throughput

On the JAX backend, `multi_gpu_model` returns the JAX engine's
`ShardedModel`; Keras's own answer is `keras.distribution.DataParallel`,
which splits each batch over the same devices. For each workload and batch
size, one process (`KERAS_BACKEND=jax`, 4 simulated CPU devices by
default) builds both from the same template weights, compiled alike
(`bench.models.compile_args`), and `bench.paired` runs one epoch of `fit`
of each in turn, the order shuffled every round, after 5 untimed epochs of
each (tracing and XLA's compilation are excluded):

* A, `multigpu`: `multi_gpu_model(model, gpus=<devices>)`;
* B, `data_parallel`: the model built and fitted under
  `keras.distribution.DataParallel` over the same devices (its `scope()`,
  which sets the distribution as `keras.distribution.set_distribution`
  does, for the build and for every `fit`).

Throughput is rows per second of an epoch; per round, the ratio of
multigpu's throughput to DataParallel's (DataParallel's epoch seconds over
multigpu's), its median and 95% bootstrap interval, and the null: A's twin
against A, which shows how far from 1.0 this run puts "no difference".

Each case also records what an uneven batch does (42 rows in batches of
16, a last batch of 10 rows): the error DataParallel raises, if any, and
whether multigpu's engine trains, with its weights' largest difference from
the template trained on one device.

Workloads: `mlp` (784-256-256-10) and `mnist_cnn` (2 conv layers) of
`bench.models`, on their first `--rows` rows.
"""

import contextlib
import functools
import statistics
import sys

from bench import models, paired

# The uneven case: 42 rows in batches of 16 leave a last batch of 10 rows,
# which 4 devices do not divide.
UNEVEN_ROWS, UNEVEN_BATCH = 42, 16


def _compiled(model, weights):
    model.set_weights(weights)
    model.compile(**models.compile_args())
    return model


def _anchor(devices):
    """DataParallel over the JAX devices that `devices` name, in order."""
    import keras

    from multigpu.runtime import jax as jax_runtime

    return keras.distribution.DataParallel(
        devices=[jax_runtime.device(name) for name in devices])


def _trained(build, x, y, batch_size, scope=None):
    """`(weights, None)` after an epoch of `build()`, or `(None, error)`.

    `scope`, if given, is entered for the build and the epoch.
    """
    try:
        with scope() if scope else contextlib.nullcontext():
            model = build()
            model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False,
                      verbose=0)
    except Exception as error:  # noqa: BLE001 - the anchor's error is a result
        return None, type(error).__name__
    return model.get_weights(), None


@functools.cache
def uneven(workload, devices):
    """What an epoch of an uneven batch does: on one device, ours, the anchor.

    Every model starts from the weights of a fresh build after
    `keras.utils.set_random_seed(0)`.

    Args:
        workload: A workload of `bench.models`.
        devices: The devices' canonical names, a tuple.

    Returns:
        Cells: `uneven_data_parallel` and `uneven_multigpu`, each "trains"
        or the name of the error raised, and `uneven_difference`, the
        largest difference between multigpu's trained weights and the
        template's trained on one device (NaN if either failed).
    """
    import keras
    import numpy as np

    import multigpu

    keras.utils.set_random_seed(0)
    weights = models.build_model(workload).get_weights()
    x, y = models.load_data(workload)
    x, y = x[:UNEVEN_ROWS], y[:UNEVEN_ROWS]

    def template():
        return _compiled(models.build_model(workload), weights)

    def ours():
        return _compiled(multigpu.multi_gpu_model(
            models.build_model(workload), gpus=len(devices)), weights)

    one, _ = _trained(template, x, y, UNEVEN_BATCH)
    trained, ours_error = _trained(ours, x, y, UNEVEN_BATCH)
    _, anchor_error = _trained(template, x, y, UNEVEN_BATCH,
                               scope=_anchor(devices).scope)
    difference = float("nan")
    if one is not None and trained is not None:
        difference = max(float(np.max(np.abs(a - b)))
                         for a, b in zip(one, trained, strict=True))
    return {"uneven_data_parallel": anchor_error or "trains",
            "uneven_multigpu": ours_error or "trains",
            "uneven_difference": difference}


def _arms(case, devices):
    import keras

    import multigpu

    workload, batch_size, rows = case["workload"], case["batch"], case["rows"]
    keras.utils.set_random_seed(0)
    x, y = models.load_data(workload)
    x, y = x[:rows], y[:rows]
    weights = models.build_model(workload).get_weights()
    anchor = _anchor(devices)

    def epoch(model, scope=None):
        def step():
            if scope is None:
                model.fit(x, y, batch_size=batch_size, epochs=1,
                          shuffle=False, verbose=0)
                return
            with scope():
                model.fit(x, y, batch_size=batch_size, epochs=1,
                          shuffle=False, verbose=0)
        return step

    def ours():
        return epoch(_compiled(multigpu.multi_gpu_model(
            models.build_model(workload), gpus=len(devices)), weights))

    def data_parallel():
        with anchor.scope():
            model = _compiled(models.build_model(workload), weights)
        return epoch(model, anchor.scope)

    def throughput(seconds):
        return {
            "multigpu_rows_per_s": rows / statistics.median(seconds["a"]),
            "data_parallel_rows_per_s": rows / statistics.median(seconds["b"]),
            **paired.ratio("speed", seconds["b"], seconds["a"]),
            **paired.ratio("speed_null", seconds["a"], seconds["twin"]),
        }

    return paired.Arms(a=ours, b=data_parallel,
                       cells={"batch_size": batch_size,
                              "steps": -(-rows // batch_size),
                              **uneven(workload, tuple(devices))},
                       after=throughput)


STUDY = paired.Study(
    name="jax_throughput", a="multigpu", b="data_parallel", arms=_arms,
    rounds=60, devices=(4,), environment={"KERAS_BACKEND": "jax"},
    axes=(paired.Axis("--workloads", "workload", ("mlp", "mnist_cnn"),
                      ("mlp", "mnist_cnn")),
          paired.Axis("--batches", "batch", (64, 128), type=int)),
    options={"rows": 1024},
    tables=((paired.text("workload"), paired.number("batch", "{batch_size}"),
             paired.number("devices", "{devices}"),
             paired.number("DataParallel rows/s",
                           "{data_parallel_rows_per_s:.0f}"),
             paired.number("multigpu rows/s", "{multigpu_rows_per_s:.0f}"),
             paired.interval("multigpu / DataParallel throughput [95%]",
                             "speed"),
             paired.interval("multigpu twin / multigpu (the null)",
                             "speed_null"),
             paired.Column("42 rows, batch 16: DataParallel",
                           "{uneven_data_parallel}", "---"),
             paired.Column("42 rows, batch 16: multigpu (vs one device)",
                           "{uneven_multigpu} ({uneven_difference:.0e})",
                           "---")),))


# `--quick`: the smoke run of `make bench-quick` (seconds of timing; most of
# its time is the imports and XLA's compilations).
QUICK = ("--devices", "4", "--rounds", "3", "--workloads", "mlp",
         "--batches", "64", "--rows", "128")


def main(argv=None):
    """Runs the study; `--quick` stands for the options of `QUICK`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--quick" in argv:
        argv.remove("--quick")
        argv = [*QUICK, *argv]
    return paired.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
