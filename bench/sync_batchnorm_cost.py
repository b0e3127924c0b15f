"""What `sync_batchnorm=True` costs per training step, next to the default.

    python -m bench.sync_batchnorm_cost --output docs/bench/sync-batchnorm-cost

For each BatchNormalization workload (`bench.models.BATCHNORM_WORKLOADS`),
engine and device count, `bench.paired` takes training steps in turn of
parallel models of the same template and weights on a repeated batch: A
with statistics pooled over the whole batch (`sync_batchnorm=True`), B with
per-replica statistics (`sync_batchnorm=False`, the default). Per round the
ratio of the pooled step to the per-replica one; its median and 95%
bootstrap interval are reported, and the null: A's twin against A.

What is pooled: the replicate engine runs the template node by node across
the replicas and adds each BatchNormalization layer's sums on the merge
device; the mirrored engine adds them with one all-reduce per layer and a
second for the squares.
"""

import sys

from bench import models, paired


def _arms(case, devices):
    workload = case["workload"]
    x, y, weights = models.seeded_start(workload)

    def build(sync_batchnorm):
        return lambda: paired.train_step(models.parallel_copy(
            workload, weights, devices, engine=case["engine"],
            sync_batchnorm=sync_batchnorm), x, y)

    return paired.Arms(a=build(True), b=build(False),
                       cells={"batch_size": len(x)})


STUDY = paired.Study(
    name="sync_batchnorm_cost", a="pooled", b="per_replica", arms=_arms,
    rounds=60,
    axes=(paired.Axis("--workloads", "workload",
                      tuple(models.BATCHNORM_WORKLOADS),
                      tuple(models.BATCHNORM_WORKLOADS)),
          paired.Axis("--engines", "engine", ("replicate", "mirrored"))),
    tables=((paired.text("workload"), paired.text("engine"),
             paired.number("devices", "{devices}"),
             paired.number("per-replica step (ms)", "{per_replica_ms:.2f}"),
             paired.number("pooled step (ms)", "{pooled_ms:.2f}"),
             paired.interval("pooled / per-replica: median [95% interval]",
                             "ratio"),
             paired.interval("pooled twin / pooled (the null)", "null")),))


def main(argv=None):
    return paired.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
