"""What a benchmark run measures: configurations, groups, repetitions."""

import dataclasses

from bench import models

RUNNER_ORDER = ("plain", "multi_gpu_model", "mirrored_by_hand", "r")
DEVICE_COUNTS = (1, 2, 4, 8)


def twin_key(key):
    """The key of the second process of the configuration `key`."""
    return f"{key}_twin"


@dataclasses.dataclass(frozen=True)
class Config:
    """One way of training a workload.

    Attributes:
        runner: `"plain"` (Keras on one device), `"multi_gpu_model"`,
            `"mirrored_by_hand"` (the MirroredStrategy script a user writes
            from the Keras guide) or `"r"` (`multi_gpu_model` driven from R).
        engine: The `engine=` of `multi_gpu_model` (None: its default, or it
            has no such parameter).
        cpu_merge: The `cpu_merge=` of `multi_gpu_model` (None: default).
        is_default: Whether this is `multi_gpu_model` as called with no
            `engine`/`cpu_merge` argument.
        twin: Whether this is a second process of the same configuration.
            Its spread against the first is the run's noise floor: what
            differs between two identical processes measured side by side.
    """

    runner: str
    engine: str | None = None
    cpu_merge: bool | None = None
    is_default: bool = False
    twin: bool = False

    @property
    def key(self):
        """A short identifier, e.g. `"replicate"` or `"replicate_gpu_merge"`."""
        if self.twin:
            return twin_key(dataclasses.replace(self, twin=False).key)
        if self.runner in ("plain", "mirrored_by_hand"):
            return self.runner
        name = self.engine or "default"
        if self.cpu_merge is False:
            name += "_device_merge"
        return f"r_{name}" if self.runner == "r" else name

    @property
    def label(self):
        """A human-readable name for tables and plots."""
        if self.runner == "plain":
            return "plain Keras, 1 device"
        if self.runner == "mirrored_by_hand":
            return "MirroredStrategy by hand"
        name = f"multi_gpu_model {self.engine or ''}".strip()
        if self.cpu_merge is False:
            name += ", cpu_merge=False"
        if self.is_default or self.twin:
            name += " (default)"
        if self.twin:
            name += ", second process"
        return f"R: {name}" if self.runner == "r" else name

    @property
    def driver(self):
        return "R" if self.runner == "r" else "python"


# Rows of the workload's data in the smoke run: four batches of the demo's
# 64, so the last batch and the split across devices still happen.
QUICK_ROWS = 256


@dataclasses.dataclass(frozen=True)
class Group:
    """The configurations run side by side: one workload, one device count.

    Plain Keras is in every group, so each round gives every configuration
    a ratio to plain Keras measured seconds apart.
    """

    workload: str
    devices: int
    configs: tuple
    warmup_epochs: int
    rounds: int
    predict_warmup: int
    predict_rounds: int
    rows: int | None = None

    @property
    def batch_size(self):
        return models.WORKLOADS[self.workload].batch_size


def all_configs(probe):
    """Every configuration, given what `bench.lockstep.probe` found, in table order.

    The default engine runs in two processes (the second is its `twin`), so
    every group measures how far two identical processes differ.

    Args:
        probe: The probe dict (`variants`, `default_engine`).
    """
    default = probe.get("default_engine")
    configs = [Config("plain")]
    for variant in probe["variants"]:
        engine, cpu_merge = variant["engine"], variant["cpu_merge"]
        config = Config("multi_gpu_model", engine, cpu_merge,
                        is_default=engine == default and cpu_merge is True)
        configs.append(config)
        if config.is_default:
            configs.append(dataclasses.replace(config, is_default=False,
                                               twin=True))
    configs.append(Config("mirrored_by_hand"))
    configs.append(Config("r", default, None))
    return configs


def select_configs(configs, selection=None):
    """The configurations whose runner or key is in `selection` (None: all).

    `"default"` in `selection` selects `multi_gpu_model` as called with no
    `engine`/`cpu_merge` argument. A configuration's twin comes with it.
    """
    if not selection:
        return list(configs)

    chosen = []
    for config in configs:
        if config.twin:
            if chosen and twin_key(chosen[-1].key) == config.key:
                chosen.append(config)
        elif (config.runner in selection or config.key in selection
              or ("default" in selection and config.is_default)):
            chosen.append(config)
    return chosen


def device_counts(probe, requested=None):
    """Device counts to run: 1, 2, 4, 8 as far as this machine has them.

    Logical CPU devices can always be made; GPUs are counted. Requested
    counts beyond the GPUs are dropped.
    """
    counts = list(requested or DEVICE_COUNTS)
    if probe["device_type"] == "GPU":
        counts = [n for n in counts if n <= probe["num_gpus"]]
    return counts


def make_groups(configs, workloads, counts, quick=False, rounds=None):
    """One `Group` per workload and device count.

    Args:
        configs: The `Config` list (plain Keras is added to every group).
        workloads: Names of workloads.
        counts: Device counts.
        quick: The CI smoke run: the first `QUICK_ROWS` rows, one warm-up
            epoch and two timed rounds. It proves the harness runs end to
            end; its numbers mean nothing.
        rounds: Timed rounds, overriding each workload's default.
    """
    plain = Config("plain")
    groups = []
    for workload in workloads:
        spec = models.WORKLOADS[workload]
        timed = rounds or (2 if quick else spec.rounds)
        for count in counts:
            members = [plain] + [c for c in configs if c != plain]
            groups.append(Group(
                workload, count, tuple(members),
                warmup_epochs=1 if quick else spec.warmup_epochs,
                rounds=timed, predict_warmup=1,
                predict_rounds=1 if quick else min(timed, 5),
                rows=QUICK_ROWS if quick else None))
    return groups
