"""`model_parallel`, the public entry: the arguments checked, then each backend's way.

On TensorFlow the model is cut into stages, one per device
(`multigpu.partition.model_parallel`); on JAX each weight is split across
the devices (`multigpu.partition.jax_sharding`). Each is imported only on
its backend, so that on JAX no TensorFlow is imported (nor needed).
"""

from multigpu import backends
from multigpu import devices as devices_lib
from multigpu.arguments import check_int
from multigpu.engines.functional import callable_graph
from multigpu.engines.own_steps import check_standard_steps


def model_parallel(model, devices=None, split=None, microbatches=1):
    """Partitions one model across devices (model parallelism).

    The model's layers are cut into consecutive stages, one per device. Each
    stage's weights are created on its device and its forward and backward
    ops run there; activations move from stage to stage. Use it when one copy
    of the model does not fit on one device (`multi_gpu_model` copies the
    whole model onto every device). Outputs and training steps are those of
    `model`.

    On the JAX backend the model is not cut into stages: every weight is
    split across the devices instead (`multigpu.partition.jax_sharding`),
    along its largest dimension the number of devices divides, and each
    device computes on the whole batch. A weight with no such dimension is
    replicated when it is smaller than 64 KiB; a larger one, or a model
    none of whose weights splits, is refused. `split` and `microbatches`
    describe stages and are refused there.

    Args:
        model: A built Keras model (Sequential or functional, branches
            allowed). It is copied, not changed: the returned model's
            `template` holds the placed, trained weights.
        devices: As for `multi_gpu_model(gpus=...)`: `None` (every GPU, or
            every logical CPU device without a GPU; with `split` given, the
            first `len(split) + 1` devices), an int >= 2, a list of GPU ids
            or a list of device names. One stage per device.
        split: `None` balances the bytes of the weights between the
            stages. Otherwise the names (or `model.layers` indices) of the
            layers where stages 2, 3, ... start, in `model.layers` order,
            e.g. `["dense_2", "dense_4"]`; or one list of layer names per
            stage, e.g. `[["left_a", "left_b"], ["right", "merge"]]`, to put
            branches on different devices. A stage may only read outputs of
            its own or earlier stages.
        microbatches: Cut every batch into this many micro-batches that
            flow through the stages in turn (GPipe pipelining), so stages
            can overlap. Gradients are summed over micro-batches and there is
            one optimizer step per batch; results equal `microbatches=1`
            (layers using batch statistics see micro-batches).

    Returns:
        A `PartitionedModel` (a `keras.Model`) with `.template`, `.devices`,
        `.stages` and `.stage_table()`; on JAX a
        `jax_sharding.ShardedWeightsModel` with `.template`, `.devices`,
        `.weight_layouts()` and `.weight_table()`. Its `save`/`save_weights`
        write the template, which loads back with plain
        `keras.models.load_model`.

    Raises:
        ValueError: for devices that do not exist, more stages than layers,
            unknown layer names or indices in `split`, a split where the
            model cannot be cut (the message says why), or an invalid
            `microbatches`; on JAX, for `split` other than None,
            `microbatches` other than 1, or weights that cannot be split
            (`jax_sharding.check_shardable`).
        UnsupportedBackendError: on a backend other than TensorFlow and
            JAX.
        TypeError: if `model` is not a `keras.Model` or `split` not a list.

    Example:
    >>> partitioned = multigpu.model_parallel(model, devices=4)
    >>> partitioned.stages          # layer names per device
    >>> partitioned.compile(optimizer="adam", loss="mse")
    >>> partitioned.fit(x, y, batch_size=64)
    >>> partitioned.save("model.keras")   # a plain Keras model
    """
    backend = backends.require_backend(
        "model_parallel", "TensorFlow's device placement (tf.device), which "
        "puts each stage's weights and operations on its device, or JAX's "
        "sharding of the weights", backend=("tensorflow", "jax"))
    microbatches = check_int("microbatches", microbatches, 1, expected=(
        "an int >= 1 (1: no pipelining; k: each batch runs as k micro-batches "
        "that overlap across stages)"))
    return PARTITIONERS[backend](model, devices, split, microbatches)


def in_stages(model, devices, split, microbatches):
    """`model_parallel` on TensorFlow: the model cut into stages, one per device.

    Args:
        model: The Keras model.
        devices: The `devices` argument, unresolved.
        split: The `split` argument.
        microbatches: The checked `microbatches`.

    Returns:
        A `multigpu.PartitionedModel`.

    Example:
    >>> in_stages(model, 2, None, 1).stages
    [['dense'], ['dense_1']]
    """
    from multigpu.partition.model_parallel import partition_model

    return partition_model(model, devices, split, microbatches)


def sharded_weights(model, devices, split, microbatches):
    """`model_parallel` on JAX: every weight split across the devices.

    Args:
        model: The Keras model.
        devices: The `devices` argument, unresolved.
        split: The `split` argument: None (stages are TensorFlow's).
        microbatches: The checked `microbatches`: 1.

    Returns:
        A `jax_sharding.ShardedWeightsModel`.

    Raises:
        ValueError: for `split` or `microbatches` other than None and 1.

    Example:
    >>> sharded_weights(model, 2, None, 1).weight_table()
    """
    from multigpu.partition import jax_sharding

    callable_graph(model)
    check_standard_steps(model, "model_parallel")
    jax_sharding.check_pipeline_arguments(split, microbatches)
    return jax_sharding.model_parallel(
        model, devices_lib.resolve_devices(devices))


# Each backend's way of `model_parallel`, by the backend's name (the
# backends `require_backend` lets through): one signature, so the entry
# picks one and branches on nothing else.
PARTITIONERS = {"tensorflow": in_stages, "jax": sharded_weights}
