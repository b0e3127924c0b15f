"""`multi_gpu_model` and its engines: how a model is spread over devices.

The engines `multi_gpu_model` offers (`ENGINES`, `DEFAULT_ENGINE`,
`check_engine`) and the public entry point, which validates its arguments
once, asks `choice.decide_engine` which engine runs, and hands the template
to it: on TensorFlow `replicate.ParallelModel` or `mirrored.MirroredModel`,
on JAX `multigpu.engines.jax.sharded.ShardedModel` (`choice.BACKEND_ENGINES`;
each backend's engines are imported only on that backend). Each engine is a
peer module; none imports another.
"""

import warnings

from multigpu import backends
from multigpu import devices as devices_lib
from multigpu.arguments import check_flag
from multigpu.devices import HOST_DEVICE
from multigpu.engines import choice as choice_lib
from multigpu.engines.functional import callable_graph
from multigpu.engines.own_steps import check_standard_steps
from multigpu.engines.template import TemplateBacked
from multigpu.messages import api, literal, literals, setting

# The engines on TensorFlow; on JAX `"auto"` and `"jax"`
# (`choice.decide_jax_engine`).
ENGINES = choice_lib.engines_of("tensorflow")
# The replicate engine runs one graph whose replicas share the template's
# variables: no variable copies, no collectives, and transfers between
# logical devices are references. On 3 or more GPUs the mirrored engine's
# ring all-reduce moves 2 (n - 1) / n copies of the gradients per device
# where the replicate engine's first device moves n - 1 copies of the
# weights and of the gradients. `"auto"` runs the engine those numbers
# favour on the devices at hand (`multigpu.engines.choice.choose_engine`).
DEFAULT_ENGINE = "auto"


def check_engine(engine, cpu_merge=True):
    """Validates the `engine` argument of `multi_gpu_model`.

    Args:
        engine: `"auto"`, `"replicate"` or `"mirrored"`.
        cpu_merge: The `cpu_merge` argument, which only the replicate engine
            uses.

    Returns:
        `engine`.

    Raises:
        ValueError: for an unknown engine, or `cpu_merge=False` with the
            mirrored engine (it has no merge step).
    """
    if engine == "jax":
        raise ValueError(
            f"Invalid `engine`: received {literal('jax')} on the TensorFlow "
            "backend; the JAX engine runs when Keras runs on JAX "
            "(KERAS_BACKEND=jax). Here use one of "
            f"{literals(list(ENGINES))}."
        )
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(
            f"Invalid `engine`: received {literal(engine)}; expected one of "
            f"{literals(list(ENGINES))}: {literal('replicate')} slices every batch between "
            f"replicas of one model, {literal('mirrored')} trains through "
            f"tf.distribute.MirroredStrategy, {literal('auto')} picks the "
            "faster one for the devices."
        )
    if engine == "mirrored" and cpu_merge is False:
        raise ValueError(
            f"Invalid `cpu_merge`: received {literal(False)} with {setting('engine', 'mirrored')}. "
            "cpu_merge places the merge of replica outputs, which only "
            f"{setting('engine', 'replicate')} has; leave {setting('cpu_merge', True)}."
        )
    return engine


def _check_not_parallel(model):
    """Refuses a model this package already spread over devices."""
    if isinstance(model, TemplateBacked):
        raise ValueError(
            f"Invalid `model`: {literal(model.name)} is already a parallel "
            f"model (from {api('multi_gpu_model')} or "
            f"{api('model_parallel')}); its replicas cannot be replicated "
            "again. Pass the model it was built from, its `template`."
        )


def _warn(choice):
    """Gives `choice`'s warning, if any, to the caller of `multi_gpu_model`."""
    if choice.warning:
        warnings.warn(choice.warning, UserWarning, stacklevel=3)


def multi_gpu_model(model, gpus=None, cpu_merge=True, cpu_relocation=False,
                    engine=DEFAULT_ENGINE, sync_batchnorm=None):
    """Replicates a model on several devices (single-machine data parallelism).

    Every batch is divided into one sub-batch per device (sizes differ by at
    most one row; no row is lost), a replica of `model` runs on each device,
    forward and backward pass, and the outputs are concatenated into one
    batch. With a batch of 64 and `gpus=2`, each device processes 32 rows.
    The mathematics are those of the template: predictions are equal and one
    optimizer step equals one step of the template on the same batch (layers
    that use batch statistics, such as BatchNormalization, see sub-batches).

    Args:
        model: A built Keras model, the template: Sequential, functional,
            or subclassed (built: called once on a batch, or `build()`;
            its replicas take inputs of the shapes it was built with).
        gpus: `None` for every GPU (every logical CPU device on a machine
            without GPU; the single device on a one-device machine, with a
            warning), an int >= 2, a list of >= 2 GPU ids, or a list of >= 2
            device names such as `["/gpu:0", "/gpu:1"]`.
        cpu_merge: Slice batches and concatenate outputs on the CPU (True) or
            on the first device (False, for GPUs joined by NVLink).
        cpu_relocation: Rebuild the model's weights on the CPU, keeping their
            values. The returned model's `template` is then that CPU copy
            (save it, or the parallel model; not the original `model`).
        engine: `"auto"` (the default), `"replicate"` (slice each batch
            between replicas of the template, outputs concatenated) or
            `"mirrored"` (train a copy through
            `tf.distribute.MirroredStrategy`, mirrored variables and
            all-reduced gradients; same contract, see `multigpu.engines.tensorflow.mirrored`).
            `"auto"` runs the replicate engine on logical CPU devices and on
            2 GPUs, the mirrored engine on 3 or more GPUs
            (`multigpu.engines.choice.decide_engine`, docs/benchmarks.md); it falls
            back to the replicate engine, with a warning naming why, when
            `cpu_merge=False` or the model cannot be copied (or its copy,
            checked on a probe batch, computes otherwise: a layer whose
            state neither its config nor Keras's saved state holds). With
            `sync_batchnorm=True` and a model the replicate engine cannot
            walk (BatchNormalization inside a subclassed model or layer) it
            runs the mirrored engine.
        sync_batchnorm: None (the default): False on TensorFlow, True on
            JAX. False: each replica's
            BatchNormalization layers take their batch statistics over its
            own share of the batch, as the original `multi_gpu_model` did
            (TensorFlow only). True: over the whole batch, so a training step equals the
            template's, moving statistics included; it costs one pooling of
            the statistics per layer and step (docs/training.md, "Batch
            statistics"). The replicate engine then runs a functional or
            Sequential model's graph across the replicas in segments cut
            at its BatchNormalization layers. On JAX, XLA's split reduces
            the moments over every device's rows: True is the only choice.

    On the JAX backend (`KERAS_BACKEND=jax`) the JAX engine runs
    (`multigpu.engines.jax.sharded.ShardedModel`): the template's variables
    are replicated on every device and XLA splits each batch inside the
    compiled step, uneven batches included. There `engine` is `"auto"` or
    `"jax"`, and `cpu_merge=False`, `cpu_relocation=True` and
    `sync_batchnorm=False` are refused (`check_jax_arguments`). On another
    backend (PyTorch) it raises `multigpu.backends.UnsupportedBackendError`.

    Returns:
        A `ParallelModel` or a `MirroredModel` (a `keras.Model`; on JAX a
        `ShardedModel`), with
        `.template`, `.devices`, `.engine` (the engine it runs) and
        `.engine_reason` (why). Its `save`/`save_weights` write the
        template, which loads back with plain `keras.models.load_model`.

    Raises:
        ValueError: for invalid `gpus`, flags, or an unbuilt model; for
            `sync_batchnorm=True` with a model neither engine can pool
            (`renorm=True`), or with `engine="replicate"` and a model it
            cannot walk.
        ValueError: for a model whose class defines its own
            `train_step`, `test_step`, `predict_step`, `compute_loss` or
            `compute_metrics` (`own_steps.check_standard_steps`): the
            engines would run Keras's standard steps instead.
        TypeError: if `model` is not a `keras.Model`.
        UnsupportedBackendError: on a Keras backend other than TensorFlow
            and JAX.

    Example:
    >>> parallel = multigpu.multi_gpu_model(model, gpus=4)
    >>> parallel.compile(optimizer="rmsprop", loss="categorical_crossentropy")
    >>> parallel.fit(x, y, epochs=20, batch_size=256)  # 64 rows per device
    >>> parallel.save("model.keras")                    # writes the template
    >>> exact = multigpu.multi_gpu_model(model, gpus=4, sync_batchnorm=True)
    """
    backend = backends.check_supported("multi_gpu_model")
    _check_not_parallel(model)
    callable_graph(model)
    check_standard_steps(model, "multi_gpu_model")
    cpu_merge = check_flag("cpu_merge", cpu_merge)
    cpu_relocation = check_flag("cpu_relocation", cpu_relocation)
    make = _MODEL_MAKERS[backend]
    return make(model, gpus, cpu_merge, cpu_relocation, engine, sync_batchnorm)


def _tensorflow_model(model, gpus, cpu_merge, cpu_relocation, engine,
                      sync_batchnorm):
    """`multi_gpu_model` on the TensorFlow backend: its two engines."""
    from multigpu.distribute import strategy as strategy_lib
    from multigpu.engines.tensorflow.mirrored import MirroredModel
    from multigpu.engines.tensorflow.relocation import relocate_to_cpu
    from multigpu.engines.tensorflow.replicate import ParallelModel
    from multigpu.engines.tensorflow.sync_batchnorm import (
        check_sync_batchnorm,
        walk_problem,
    )

    strategy_lib.check_outside_strategies("multi_gpu_model", model)
    sync_batchnorm = check_sync_batchnorm(
        False if sync_batchnorm is None else sync_batchnorm)
    check_engine(engine, cpu_merge)
    devices = devices_lib.resolve_devices(gpus)
    template = relocate_to_cpu(model) if cpu_relocation else model
    problem = walk_problem(template) if sync_batchnorm else None
    choice = choice_lib.decide_engine(engine, devices, cpu_merge,
                                      walk_problem=problem)
    _warn(choice)
    if choice.engine == "mirrored":
        try:
            parallel = MirroredModel(template, devices,
                                     sync_batchnorm=sync_batchnorm)
        except ValueError as error:
            # Whether the mirrored engine takes the model shows only when
            # it copies it: the decision is made again, knowing.
            choice = choice_lib.decide_engine(
                engine, devices, cpu_merge, walk_problem=problem,
                refusal=error)
            _warn(choice)
    if choice.engine == "replicate":
        merge_device = HOST_DEVICE if cpu_merge else devices[0]
        parallel = ParallelModel(template, devices, merge_device,
                                 sync_batchnorm=sync_batchnorm)
    parallel.engine_reason = choice.engine_reason
    return parallel


def check_jax_arguments(cpu_merge, cpu_relocation, sync_batchnorm):
    """Refuses the arguments of `multi_gpu_model` that mean nothing on JAX.

    Under XLA's split each device holds its share of the batch and the
    template's variables, replicated: there is no merge step to place
    (`cpu_merge`), no copy of the weights on the CPU to make
    (`cpu_relocation`), and BatchNormalization's moments are reduced over
    every device's rows, which is `sync_batchnorm=True`.

    Args:
        cpu_merge: The validated `cpu_merge` argument.
        cpu_relocation: The validated `cpu_relocation` argument.
        sync_batchnorm: The `sync_batchnorm` argument (None: the backend's
            default).

    Returns:
        True, the `sync_batchnorm` the JAX engine runs.

    Raises:
        ValueError: for `cpu_merge=False`, `cpu_relocation=True` or
            `sync_batchnorm=False`, naming the argument and why.
    """
    if cpu_merge is False:
        raise ValueError(
            f"Invalid `cpu_merge`: received {literal(False)} on the JAX "
            "backend. cpu_merge places the merge of replica outputs, a step "
            "XLA's split does not have: each device computes its share of the "
            f"batch and XLA gathers the outputs. Leave {setting('cpu_merge', True)}."
        )
    if cpu_relocation is True:
        raise ValueError(
            f"Invalid `cpu_relocation`: received {literal(True)} on the JAX "
            "backend, where the template's variables are replicated on every "
            "device; there is no copy on the CPU to make. Leave "
            f"{setting('cpu_relocation', False)}."
        )
    if sync_batchnorm is None:
        return True
    if check_flag("sync_batchnorm", sync_batchnorm) is False:
        raise ValueError(
            f"Invalid `sync_batchnorm`: received {literal(False)} on the JAX "
            "backend. XLA splits each batch inside one compiled step, and "
            "BatchNormalization's moments are reduced over every device's "
            f"rows: that is {setting('sync_batchnorm', True)}, the only "
            f"choice there. Pass {setting('sync_batchnorm', True)} or leave "
            f"it {literal(None)} (the default)."
        )
    return True


def resolve_sync_batchnorm(value):
    """`sync_batchnorm` checked as the running backend's engines take it.

    For the callers that build an engine's model later
    (`check_equivalence`): None becomes the backend's default, False for
    the TensorFlow engines; on JAX, XLA's split pools BatchNormalization's
    statistics over the whole batch: True (a False is passed on, for
    `multi_gpu_model` to refuse with its reason).

    Args:
        value: The `sync_batchnorm` argument.

    Returns:
        True or False.

    Raises:
        ValueError: if `value` is not None or a bool.
        UnsupportedBackendError: on a backend no engine serves (PyTorch).

    Example:
    >>> resolve_sync_batchnorm(None)   # on TensorFlow
    False
    """
    backend = backends.check_supported("check_equivalence")
    return _SYNC_BATCHNORM_RESOLVERS[backend](value)


def _tensorflow_sync_batchnorm(value):
    from multigpu.engines.tensorflow.sync_batchnorm import check_sync_batchnorm

    return check_sync_batchnorm(False if value is None else value)


def _jax_sync_batchnorm(value):
    return True if value is None else check_flag("sync_batchnorm", value)


def _jax_model(model, gpus, cpu_merge, cpu_relocation, engine,
               sync_batchnorm):
    """`multi_gpu_model` on the JAX backend: its one engine."""
    from multigpu.engines.jax.sharded import ShardedModel

    check_jax_arguments(cpu_merge, cpu_relocation, sync_batchnorm)
    choice = choice_lib.decide_jax_engine(engine)
    devices = devices_lib.resolve_devices(gpus)
    parallel = ShardedModel(model, devices)
    parallel.engine_reason = choice.engine_reason
    return parallel


# Each backend's makers, by the name `backends.check_supported` returns: a
# backend is served by adding its entry here, none is the default.
_MODEL_MAKERS = {"tensorflow": _tensorflow_model, "jax": _jax_model}
_SYNC_BATCHNORM_RESOLVERS = {"tensorflow": _tensorflow_sync_batchnorm,
                             "jax": _jax_sync_batchnorm}
