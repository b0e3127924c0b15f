"""The mirrored engine's step: zero-row padding against the old `tf.cond`.

    python -m bench.zero_row_padding --output docs/bench/zero-row-padding

A replica whose share of the batch is empty used to run its forward pass
in a `tf.cond` (`forward.inference_on_empty_share`): on every step, also
when every replica has rows. It now runs on one row of zeros with no cond
(`forward.padded_on_empty_share`). For each workload, one process with 4
logical CPU devices builds three mirrored models of the same template and
weights and takes one training step of each in turn on a repeated batch,
the order shuffled every round (`bench.guard_cost.paired`):

* `cond`: the previous default, the forward pass inside the zero-row cond
  (re-created here from `forward.inference_on_empty_share`, as the engine
  ran it before; the workloads add no layer losses, which it could not
  carry);
* `padded`: the default now;
* `pooled`: `sync_batchnorm=True`, the path that padded already.

The ratios of each round (padded / cond, padded / pooled) are reported as
medians with 95% bootstrap intervals: the three models share the machine's
load, which a busy machine changes between separate runs.

Workloads: `demo` (the demo's CNN, `bench.models`) and `bn_cnn` (the
BatchNormalization CNN of `bench.sync_batchnorm_cost`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench import models, report
from bench import sync_batchnorm_cost as bn
from bench.guard_cost import paired

WORKLOADS = ("demo", "bn_cnn")
VARIANTS = ("cond", "padded", "pooled")


def _template(workload):
    if workload == "demo":
        return models.build_model("demo")
    return bn.build_model(workload)


def _batch(workload):
    import numpy as np

    if workload == "demo":
        x, y = models.load_data("demo")
        batch = models.WORKLOADS["demo"].batch_size
        return x[:batch], y[:batch]
    _, batch, shape = bn.WORKLOADS[workload]
    rng = np.random.default_rng(0)
    return (rng.random((batch, *shape), dtype=np.float32),
            rng.integers(0, bn.NUM_CLASSES, batch, dtype=np.int32))


def _cond_on_empty_share_class():
    """A `MirroredModel` whose call runs the old zero-row `tf.cond`."""
    import keras

    from multigpu import internals
    from multigpu.engines.tensorflow.forward import inference_on_empty_share, with_logits
    from multigpu.engines.tensorflow.mirrored import MirroredModel

    class CondOnEmptyShare(MirroredModel):
        def call(self, inputs, training=None, mask=None):
            logits_at = []

            def forward_in(mode):
                def forward(*flat):
                    args = keras.tree.pack_sequence_as(inputs, list(flat))
                    ys = keras.tree.flatten(super(MirroredModel, self).call(
                        args, training=mode, mask=mask))
                    logits = [internals.logits_of(y) for y in ys]
                    logits_at[:] = [i for i, z in enumerate(logits)
                                    if z is not None]
                    return ys + [logits[i] for i in logits_at]
                return forward

            forward = inference_on_empty_share(forward_in(training),
                                               forward_in(False))
            flat = with_logits(forward(*keras.tree.flatten(inputs)),
                               logits_at)
            return keras.tree.pack_sequence_as(self.output, flat)

    return CondOnEmptyShare


def _model(workload, devices, variant, weights):
    import keras

    import multigpu

    template = _template(workload)
    template.set_weights(weights)
    model = multigpu.multi_gpu_model(template, gpus=devices,
                                     engine="mirrored",
                                     sync_batchnorm=variant == "pooled")
    if variant == "cond":
        model.__class__ = _cond_on_empty_share_class()
    model.compile(optimizer=keras.optimizers.SGD(1e-3),
                  loss="sparse_categorical_crossentropy")
    return model


def measure(workload, devices, rounds):
    """The three variants of one workload, stepped in turn.

    Returns:
        A dict: the median step of each variant (ms), and the medians and
        95% intervals of padded / cond and padded / pooled.
    """
    import keras

    keras.utils.set_random_seed(0)
    x, y = _batch(workload)
    weights = _template(workload).get_weights()
    seconds = paired({v: _model(workload, devices, v, weights)
                      for v in VARIANTS}, x, y, rounds)
    row = {"workload": workload, "devices": len(devices), "rounds": rounds,
           "batch_size": len(x)}
    for variant in VARIANTS:
        row[f"{variant}_ms"] = 1e3 * statistics.median(seconds[variant])
    for other in ("cond", "pooled"):
        ratios = [a / b for a, b in zip(seconds["padded"], seconds[other])]
        low, high = report.median_interval(ratios)
        row[f"padded_over_{other}"] = [statistics.median(ratios), low, high]
    return row


def markdown(rows):
    """The results as a Markdown table."""
    lines = [
        "| workload | devices | cond step (ms) | padded step (ms) "
        "| pooled step (ms) | padded / cond [95%] | padded / pooled [95%] |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ratios = [
            "{:.3f} [{:.3f}, {:.3f}]".format(*r[f"padded_over_{other}"])
            for other in ("cond", "pooled")]
        lines.append(
            f"| {r['workload']} | {r['devices']} | {r['cond_ms']:.2f} | "
            f"{r['padded_ms']:.2f} | {r['pooled_ms']:.2f} | "
            f"{ratios[0]} | {ratios[1]} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.zero_row_padding")
    parser.add_argument("--output", default="out/zero-row-padding")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=40,
                        help="paired steps per workload")
    parser.add_argument("--worker", action="store_true",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown --workloads {sorted(unknown)}; expected some "
                     f"of {list(WORKLOADS)}")
    if args.worker:
        import warnings

        import multigpu

        devices = multigpu.virtual_devices(args.devices)
        warnings.simplefilter("ignore", UserWarning)
        rows = []
        for workload in workloads:
            rows.append(measure(workload, devices, args.rounds))
            print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr,
                  flush=True)
        print(json.dumps(rows))
        return 0
    load_before = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, "-m", "bench.zero_row_padding", "--worker",
         "--devices", str(args.devices), "--workloads", ",".join(workloads),
         "--rounds", str(args.rounds)],
        stdout=subprocess.PIPE, text=True, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if done.returncode:
        raise SystemExit("zero_row_padding worker failed")
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    report.write_results(
        args.output, {"rows": rows, "load_1min_before": load_before,
                      "load_1min_after": os.getloadavg()[0]},
        markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
