"""Each replica's forward AND backward ops really run on its device."""

import pytest

import multigpu
from multigpu.placement import ops_by_device
from support.models import data, mlp

pytestmark = pytest.mark.filterwarnings("ignore:No GPU found")


def is_matmul(op):
    return "MatMul" in op


def test_training_step_runs_matmuls_on_each_replica_device(rng):
    parallel = multigpu.multi_gpu_model(mlp(), gpus=["/cpu:2", "/cpu:3"])
    parallel.compile(optimizer="sgd", loss="mse")
    x, y = data(rng, 16)
    _, ops = multigpu.executed_ops(
        parallel.fit, x, y, batch_size=16, epochs=1, verbose=0)
    matmuls = ops_by_device(ops, is_matmul)
    # Two dense layers: 2 forward + 3 backward matmuls per replica (the
    # first layer needs no input gradient). Every batch has 16 rows, a size
    # known when the step is traced, so the step for batches smaller than
    # the device count is not traced. None on the unused devices.
    assert matmuls.get("/device:CPU:2") == 5
    assert matmuls.get("/device:CPU:3") == 5
    assert "/device:CPU:1" not in matmuls
    assert "/device:CPU:0" not in matmuls


@pytest.mark.parametrize("cpu_merge, merge_device", [
    (True, "/device:CPU:0"), (False, "/device:CPU:1")])
def test_outputs_are_concatenated_on_the_merge_device(rng, cpu_merge, merge_device):
    parallel = multigpu.multi_gpu_model(
        mlp(), gpus=["/cpu:1", "/cpu:2", "/cpu:3"], cpu_merge=cpu_merge)
    x, _ = data(rng, 9)
    _, ops = multigpu.executed_ops(parallel.predict, x, verbose=0)
    concat = ops_by_device(ops, lambda op: op == "ConcatV2")
    assert concat == {merge_device: 1}
    matmuls = ops_by_device(ops, is_matmul)
    assert set(matmuls) == {"/device:CPU:1", "/device:CPU:2", "/device:CPU:3"}
