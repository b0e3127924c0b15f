"""Former public names keep working, with a warning naming the new one."""

import warnings

import keras
import pytest

import multigpu
from multigpu.engines.tensorflow import replicate as replicas


def test_data_parallel_is_a_deprecated_alias_of_data_parallel_replicas():
    with pytest.warns(DeprecationWarning,
                      match=r"multigpu\.DataParallelReplicas"):
        alias = multigpu.DataParallel
    assert alias is multigpu.DataParallelReplicas is replicas.DataParallelReplicas


def test_importing_the_new_name_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from multigpu import DataParallelReplicas  # noqa: F401


def test_a_star_import_no_longer_shadows_keras_data_parallel():
    names = {}
    exec("from keras.distribution import DataParallel\n"
         "from multigpu import *", names)
    assert names["DataParallel"] is keras.distribution.DataParallel


def test_the_parallel_model_is_built_from_the_renamed_layer():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    parallel = multigpu.multi_gpu_model(model, gpus=2)
    assert isinstance(parallel.replicas_layer, multigpu.DataParallelReplicas)


def test_an_unknown_attribute_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        multigpu.Nope  # noqa: B018
