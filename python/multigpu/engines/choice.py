"""Which engine `multi_gpu_model` runs on given devices, and why.

The byte counts of a step decide (docs/benchmarks.md, "Where the bytes go"):
the replicate engine's first device moves `n - 1` copies of the weights and
gradients, the mirrored engine's ring all-reduce `2 (n - 1) / n` copies per
device (`choose_engine`). An argument or a model one engine cannot take
overrides the prediction, and the choice says so (`EngineChoice.fallback`,
`EngineChoice.warning`). `decide_engine` makes the whole decision for
`multi_gpu_model`, which only builds what it says.
"""

import collections

from multigpu.messages import literal, setting

# The engines of each Keras backend `multi_gpu_model` serves
# (`multigpu.backends.ENGINE_BACKENDS`): an engine for another backend goes
# into a folder of its own beside `engines/tensorflow` and `engines/jax`,
# with its name here and a branch in `front.multi_gpu_model`.
BACKEND_ENGINES = {
    "tensorflow": ("replicate", "mirrored"),
    "jax": ("jax",),
}
# Picks among the engines of the backend that runs.
AUTO = "auto"


def engines_of(backend):
    """The `engine` values `multi_gpu_model` takes on `backend`.

    Args:
        backend: A name of `BACKEND_ENGINES`.

    Returns:
        `"auto"`, then the backend's engines.

    Example:
    >>> engines_of("tensorflow")
    ('auto', 'replicate', 'mirrored')
    """
    return (AUTO, *BACKEND_ENGINES[backend])


class EngineChoice(collections.namedtuple(
        "EngineChoice", ["engine", "reason", "fallback", "warning"],
        defaults=[None, None])):
    """The engine `multi_gpu_model` runs, and why.

    Attributes:
        engine: `"replicate"` or `"mirrored"`.
        reason: Why that engine: requested, predicted (`choose_engine`), or
            the only one that can do what was asked.
        fallback: None, or why the predicted winner could not be used (an
            argument or a model it cannot take); `engine` is then the one
            used instead.
        warning: None, or the warning `multi_gpu_model` gives: `"auto"`
            runs another engine than its prediction.
    """

    __slots__ = ()

    @property
    def engine_reason(self):
        """The `engine_reason` of the model built: the reason, and the fallback's."""
        if self.fallback:
            return f"{self.reason}; fell back: {self.fallback}"
        return self.reason


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


def decide_jax_engine(engine):
    """The engine `multi_gpu_model` runs on the JAX backend, and why.

    `"auto"` and `"jax"` run the JAX engine (`multigpu.engines.jax`), the
    only one there; the TensorFlow engines are refused, saying why.

    Args:
        engine: The `engine` argument.

    Returns:
        An `EngineChoice`.

    Raises:
        ValueError: for `"replicate"`, `"mirrored"` or an unknown engine.

    Example:
    >>> decide_jax_engine("auto").engine
    'jax'
    """
    why = {
        "replicate": "places one replica per device with TensorFlow's "
                     "tf.device and runs a TensorFlow graph",
        "mirrored": "trains through TensorFlow's tf.distribute.MirroredStrategy",
    }
    if not isinstance(engine, str) or engine not in ("auto", "jax", *why):
        raise ValueError(
            f"Invalid `engine`: received {literal(engine)}; on the JAX backend "
            f"expected {literal('auto')} or {literal('jax')}."
        )
    if engine in why:
        raise ValueError(
            f"Invalid `engine`: received {literal(engine)} on the JAX backend. "
            f"The {engine} engine {why[engine]}, which the JAX backend does "
            f"not run. Use {setting('engine', 'auto')} (or "
            f"{literal('jax')}): XLA splits each batch across the devices."
        )
    if engine == "jax":
        return EngineChoice("jax", f"requested with {setting('engine', 'jax')}")
    return EngineChoice("jax", (
        "the Keras backend is JAX: XLA splits each batch across the devices "
        "inside the compiled step"))


def decide_engine(engine, devices, cpu_merge=True, walk_problem=None,
                  refusal=None):
    """The engine `multi_gpu_model` runs, and why: its one decision.

    `engine="replicate"` or `"mirrored"` runs as requested. `"auto"` runs
    the predicted winner (`choose_engine`) unless the arguments or the
    model rule it out, and says why (`EngineChoice.fallback`, with a
    warning):

    * `cpu_merge=False` places a merge step that only the replicate engine
      has;
    * with `sync_batchnorm=True`, a model the replicate engine cannot walk
      (`walk_problem`) needs the mirrored engine, which pools its
      BatchNormalization statistics;
    * a model the mirrored engine refuses (it cannot copy it, or the copy
      computes otherwise: `copies.copy_in_scope`) is known only once the
      copy is made: `multi_gpu_model` then asks again with the refusal.

    Args:
        engine: The validated `engine` argument (`front.check_engine`).
        devices: Canonical device names (`multigpu.resolve_devices`).
        cpu_merge: The `cpu_merge` argument.
        walk_problem: None, or with `sync_batchnorm=True` why the replicate
            engine cannot pool the model's statistics
            (`sync_batchnorm.walk_problem`).
        refusal: None, or the ValueError the mirrored engine raised on the
            model this choice gave it.

    Returns:
        An `EngineChoice`.

    Raises:
        ValueError: for `engine="replicate"` with a `walk_problem`; the
            `refusal` itself when the engine was requested; a `refusal`
            with a `walk_problem`, which neither engine can take.

    Example:
    >>> gpus = ["/device:GPU:%d" % i for i in range(4)]
    >>> decide_engine("auto", gpus).engine
    'mirrored'
    >>> decide_engine("auto", gpus, cpu_merge=False).engine
    'replicate'
    """
    if engine == "auto":
        choice = _predicted(devices, cpu_merge)
    else:
        choice = EngineChoice(engine, f"requested with {setting('engine', engine)}")
    if walk_problem is not None and choice.engine != "mirrored":
        choice = _pooling_choice(engine, walk_problem)
    if refusal is not None and choice.engine == "mirrored":
        choice = _refused(choice, engine, walk_problem, refusal)
    return choice


def _predicted(devices, cpu_merge):
    """What `engine="auto"` runs before the model is looked at."""
    choice = choose_engine(devices)
    if choice.engine == "mirrored" and cpu_merge is False:
        return _fall_back_to_replicate(choice, (
            f"{setting('cpu_merge', False)} places the merge of "
            "replica outputs on the first device, a step only the replicate "
            "engine has"))
    return choice


def _pooling_choice(engine, walk_problem):
    """The mirrored engine, which pools what the replicate engine cannot.

    Raises:
        ValueError: for `engine="replicate"`.
    """
    if engine == "replicate":
        raise ValueError(
            f"Invalid `model` for {setting('sync_batchnorm', True)} with "
            f"{setting('engine', 'replicate')}: {walk_problem}, so its "
            "BatchNormalization layers cannot see the other replicas' rows. "
            f"Use {setting('engine', 'mirrored')} (or "
            f"{setting('engine', 'auto')}), whose strategy pools them, or "
            "build the model as a functional or Sequential model."
        )
    reason = (f"{setting('sync_batchnorm', True)} and {walk_problem}: only "
              "the mirrored engine pools its BatchNormalization statistics")
    return EngineChoice("mirrored", reason, warning=(
        f"{setting('engine', 'auto')} runs the mirrored engine: {reason}. "
        f"Pass {setting('engine', 'mirrored')} to choose it and silence "
        "this warning."))


def _refused(choice, engine, walk_problem, refusal):
    """The replicate engine after the mirrored engine refused the model.

    Raises:
        ValueError: `refusal` when the mirrored engine was requested, or
            with a `walk_problem` (the replicate engine cannot pool it).
    """
    if walk_problem is not None:
        raise ValueError(
            f"{refusal} With {setting('sync_batchnorm', True)} the "
            f"replicate engine cannot take it either: {walk_problem}. "
            f"Leave {setting('sync_batchnorm', False)} for this "
            "model.") from None
    if engine != "auto":
        raise refusal
    return _fall_back_to_replicate(
        choice, "the mirrored engine cannot take the model ("
        f"{' '.join(str(refusal).split())})")


def _fall_back_to_replicate(choice, why):
    """The replicate engine instead of `choice`'s, with `why` as fallback."""
    return EngineChoice("replicate", choice.reason, fallback=why,
                        warning=_fallback_message(choice.reason, why))


def _fallback_message(reason, why):
    """The warning `multi_gpu_model` gives when `engine="auto"` falls back."""
    auto = setting("engine", "auto")
    replicate = setting("engine", "replicate")
    return (
        f"{auto} would pick the mirrored engine ({reason}), but {why}: "
        f"using {replicate}. Pass {replicate} to choose it and silence this "
        "warning."
    )
