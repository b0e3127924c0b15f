"""The mirrored engine's step: zero-row padding against the old `tf.cond`.

    python -m bench.zero_row_padding --output docs/bench/zero-row-padding

The mirrored engine runs a replica whose share of the batch is empty on
one row of zeros, with no cond (`forward.padded_on_empty_share`); the
alternative is its forward pass in a `tf.cond`
(`forward.inference_on_empty_share`), on every step, also when every
replica has rows. For each workload, one process with 4 logical CPU
devices builds mirrored models of the same template and weights and
`bench.paired` takes one training step of each in turn on a repeated
batch, the order shuffled every round:

* A, `padded`: the engine's default;
* B, `cond`: the forward pass inside the zero-row cond (re-created here
  from `forward.inference_on_empty_share`; the workloads add no layer
  losses, which it cannot carry);
* beside them, `pooled`: `sync_batchnorm=True`, which pads too.

The ratios of each round (padded / cond, padded / pooled, and the null:
A's twin against A) are reported as medians with 95% bootstrap intervals:
the models share the machine's load, which a busy machine changes between
separate runs.

Workloads: `demo` (the demo's CNN) and `bn_cnn` (the BatchNormalization
CNN), of `bench.models`.
"""

import sys

from bench import models, paired


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


def _arms(case, devices):
    workload = case["workload"]
    x, y, weights = models.seeded_start(workload)

    def variant(name):
        def make():
            model = models.parallel_copy(workload, weights, devices,
                                         engine="mirrored",
                                         sync_batchnorm=name == "pooled")
            if name == "cond":
                model.__class__ = _cond_on_empty_share_class()
            return paired.train_step(model, x, y)
        return make

    def over_pooled(seconds):
        return paired.ratio("padded_over_pooled", seconds["a"], seconds["pooled"])

    return paired.Arms(a=variant("padded"), b=variant("cond"),
                       beside={"pooled": variant("pooled")},
                       cells={"batch_size": len(x)}, after=over_pooled)


STUDY = paired.Study(
    name="zero_row_padding", a="padded", b="cond", arms=_arms, rounds=40,
    devices=(4,),
    axes=(paired.Axis("--workloads", "workload", ("demo", "bn_cnn"),
                      ("demo", "bn_cnn")),),
    tables=((paired.text("workload"), paired.number("devices", "{devices}"),
             paired.number("cond step (ms)", "{cond_ms:.2f}"),
             paired.number("padded step (ms)", "{padded_ms:.2f}"),
             paired.number("pooled step (ms)", "{pooled_ms:.2f}"),
             paired.interval("padded / cond [95%]", "ratio"),
             paired.interval("padded / pooled [95%]", "padded_over_pooled"),
             paired.interval("padded twin / padded (the null)", "null")),))


def main(argv=None):
    return paired.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
