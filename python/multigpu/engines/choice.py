"""Which engine `multi_gpu_model` runs on given devices, and why.

The byte counts of a step decide (docs/benchmarks.md, "Where the bytes go"):
the replicate engine's first device moves `n - 1` copies of the weights and
gradients, the mirrored engine's ring all-reduce `2 (n - 1) / n` copies per
device. An argument or a model one engine cannot take overrides the
prediction, and the choice says so (`EngineChoice.fallback`).
"""

import collections

from multigpu import messages

EngineChoice = collections.namedtuple(
    "EngineChoice", ["engine", "reason", "fallback"], defaults=[None])
EngineChoice.__doc__ = """The engine `multi_gpu_model` runs, and why.

`fallback` is None, or why the predicted winner could not be used (an
argument or a model it cannot take); `engine` is then the one used instead.
"""


def choose_engine(devices):
    """The engine of `multi_gpu_model` that should be fastest on `devices`.

    From the byte counts (docs/benchmarks.md, "Where the bytes go"): per
    step, the replicate engine's first device sends `n - 1` copies of the
    weights and receives `n - 1` copies of the gradients, where the
    mirrored engine's ring all-reduce moves `2 (n - 1) / n` copies per
    device. On GPUs, from 3 devices on, that makes the mirrored engine the
    predicted winner; on 2 GPUs both move one copy and the replicate
    engine's smaller fixed cost decides. On logical CPU devices the copies
    are references and the replicate engine is the measured winner.

    Args:
        devices: Canonical device names (`multigpu.resolve_devices`).

    Returns:
        An `EngineChoice(engine, reason)`.

    Example:
    >>> choose_engine(["/device:GPU:%d" % i for i in range(8)]).engine
    'mirrored'
    """
    devices = list(devices)
    gpus = [d for d in devices if "GPU" in d.upper()]
    if len(gpus) >= 3:
        n = len(devices)
        return EngineChoice("mirrored", (
            f"on {n} GPUs the replicate engine's first device would send "
            f"{n - 1} copies of the weights and receive {n - 1} copies of "
            f"the gradients per step; the mirrored engine's all-reduce "
            f"moves {2 * (n - 1) / n:.2f} copies per device"))
    if gpus:
        return EngineChoice("replicate", (
            "on 2 GPUs both engines move one copy of the weights per device "
            "per step; the replicate engine has the smaller fixed cost"))
    return EngineChoice("replicate", (
        "on logical CPU devices transfers are references, not copies; the "
        "replicate engine is the measured winner (docs/benchmarks.md)"))


def auto_engine(devices, cpu_merge=True):
    """What `engine="auto"` runs on `devices`, given the other arguments.

    The predicted winner (`choose_engine`), unless an argument rules it
    out: `cpu_merge=False` places a merge step that only the replicate
    engine has. A model the mirrored engine cannot copy, or whose copy
    computes otherwise (`multigpu.engines.copies.check_copy`), is found only when
    the copy is made (`multi_gpu_model` falls back then).

    Args:
        devices: Canonical device names (`multigpu.resolve_devices`).
        cpu_merge: The `cpu_merge` argument of `multi_gpu_model`.

    Returns:
        An `EngineChoice`; its `fallback` says why the predicted winner
        is not the engine, or is None.

    Example:
    >>> auto_engine(["/device:GPU:%d" % i for i in range(4)],
    ...             cpu_merge=False).engine
    'replicate'
    """
    choice = choose_engine(devices)
    if choice.engine == "mirrored" and cpu_merge is False:
        return fall_back_to_replicate(choice, (
            f"{messages.setting('cpu_merge', False)} places the merge of "
            "replica outputs on the first device, a step only the replicate "
            "engine has"))
    return choice


def fall_back_to_replicate(choice, why):
    """The replicate engine instead of `choice`'s, with `why` as fallback.

    Args:
        choice: The `EngineChoice` that could not be used.
        why: Why, one clause naming the argument or the model.

    Returns:
        An `EngineChoice` of the replicate engine.
    """
    return EngineChoice("replicate", choice.reason, fallback=why)


def fallback_message(choice):
    """The warning `multi_gpu_model` gives when `engine="auto"` falls back.

    Args:
        choice: An `EngineChoice` whose `fallback` is set.

    Returns:
        One message naming the predicted engine, why, and what runs.
    """
    auto = messages.setting("engine", "auto")
    return (
        f"{auto} would pick the mirrored engine ({choice.reason}), but "
        f"{choice.fallback}: using {messages.setting('engine', 'replicate')}. "
        f"Pass {messages.setting('engine', 'replicate')} to choose it and "
        "silence this warning."
    )
