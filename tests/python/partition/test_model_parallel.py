"""model_parallel: one model cut into stages, one stage per device."""

import keras
import numpy as np
import pytest

import multigpu
from conftest import DEVICES
from multigpu.partition.stages import balanced_split
from multigpu.placement import PLUMBING_OPS, executed_nodes, variables_by_device
from multigpu.variables import variable_device
from support.models import copy_of, data, max_weight_difference

TOL = 1e-5


def deep_mlp(input_dim=8, widths=(16, 16, 16, 16), outputs=3):
    """A Sequential MLP whose layers are named d0, d1, ..., out."""
    layers = [keras.Input((input_dim,))]
    layers += [keras.layers.Dense(w, activation="tanh", name=f"d{i}")
               for i, w in enumerate(widths)]
    layers.append(keras.layers.Dense(outputs, name="out"))
    return keras.Sequential(layers, name="deep")


def two_branches(input_dim=8):
    """A functional model with two branches merged by a concatenation."""
    inputs = keras.Input((input_dim,), name="features")
    left = keras.layers.Dense(12, activation="tanh", name="left_a")(inputs)
    left = keras.layers.Dense(6, activation="tanh", name="left_b")(left)
    right = keras.layers.Dense(6, activation="tanh", name="right")(inputs)
    merged = keras.layers.Concatenate(name="merge")([left, right])
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(merged),
                       name="branches")


def sgd_step(model, x, y):
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.train_on_batch(x, y)


def assert_same_weights(a, b):
    assert max_weight_difference(a, b) < TOL


# --- stages and variables --------------------------------------------------


def test_auto_split_one_stage_per_device_weights_on_their_device():
    model = deep_mlp()
    partitioned = multigpu.model_parallel(model, devices=4)
    assert partitioned.devices == DEVICES
    assert partitioned.stages == [["d0"], ["d1"], ["d2"], ["d3", "out"]]
    for device, names in zip(partitioned.devices, partitioned.stages):
        for name in names:
            for v in partitioned.template.get_layer(name).weights:
                assert variable_device(v) == device, v.path
    # The user's model is copied, not moved.
    assert {variable_device(v) for v in model.weights} == {DEVICES[0]}
    table = partitioned.stage_table()
    assert [row["device"] for row in table] == DEVICES
    assert [row["variables"] for row in table] == [2, 2, 2, 4]
    assert sum(row["variable_bytes"] for row in table) == sum(
        w.nbytes for w in model.get_weights())


def test_auto_split_balances_parameter_bytes_under_35_percent():
    # Uneven layers: four equal-count stages would put 47% on one device.
    model = deep_mlp(input_dim=16, widths=(64, 32, 32, 32, 32, 16), outputs=4)
    partitioned = multigpu.model_parallel(model, devices=4)
    observed = variables_by_device(partitioned)
    total = sum(b for _, b in observed.values())
    assert total == sum(w.nbytes for w in model.get_weights())
    assert sorted(observed) == DEVICES
    for device, (_, nbytes) in observed.items():
        assert nbytes / total < 0.35, (device, nbytes / total)
    naive = [model.layers[i:i + 2] for i in range(0, 8, 2)]
    assert max(sum(w.nbytes for layer in g for w in layer.get_weights())
               for g in naive) / total > 0.35


def test_balanced_split_minimises_the_largest_stage():
    assert balanced_split([6, 1, 1, 1, 1, 1, 1], 2) == [1]
    assert balanced_split([4, 4, 1, 1, 1, 1], 2) == [2]  # ties: fewer layers
    assert balanced_split([1, 1, 1, 1], 4) == [1, 2, 3]
    assert balanced_split([0, 0, 0, 0, 0, 0], 3) == [2, 4]
    assert balanced_split([10, 1, 1, 1, 10], 3) == [1, 4]


def test_split_by_names_indices_and_sets_agree():
    model = deep_mlp()
    by_name = multigpu.model_parallel(model, devices=2, split=["d2"])
    by_index = multigpu.model_parallel(model, devices=2, split=[2])
    with_first = multigpu.model_parallel(model, devices=2, split=["d0", "d2"])
    by_sets = multigpu.model_parallel(
        model, devices=2, split=[["d0", "d1"], ["d2", "d3", "out"]])
    expected = [["d0", "d1"], ["d2", "d3", "out"]]
    for partitioned in (by_name, by_index, with_first, by_sets):
        assert partitioned.stages == expected
        assert partitioned.devices == DEVICES[:2]


def test_devices_default_to_one_per_split_stage():
    partitioned = multigpu.model_parallel(deep_mlp(), split=["d1", "d3"])
    assert partitioned.devices == DEVICES[:3]
    assert partitioned.stages == [["d0"], ["d1", "d2"], ["d3", "out"]]


# --- outputs, training, observed placement -----------------------------------


def test_outputs_and_one_training_step_equal_the_template(rng):
    model = deep_mlp()
    reference = copy_of(model)
    partitioned = multigpu.model_parallel(model, devices=4)
    x, y = data(rng, 10)
    np.testing.assert_allclose(
        partitioned.predict(x, verbose=0), reference.predict(x, verbose=0),
        atol=TOL)
    sgd_step(partitioned, x, y)
    sgd_step(reference, x, y)
    assert max_weight_difference(reference, model) > 1e-3  # it did learn
    assert_same_weights(partitioned.template, reference)


def test_each_stage_forward_and_backward_ops_run_on_its_device(rng):
    partitioned = multigpu.model_parallel(deep_mlp(), devices=4)
    partitioned.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = data(rng, 8)
    _, nodes = executed_nodes(partitioned.train_on_batch, x, y)
    for stage, device in enumerate(partitioned.devices):
        mine = [n for n in nodes if f"/stage{stage}/" in n.name
                and n.op not in PLUMBING_OPS]  # a _Recv is named by its source
        forward = [n for n in mine if "MatMul" in n.op
                   and not n.name.startswith("gradients")]
        backward = [n for n in mine if "MatMul" in n.op
                    and n.name.startswith("gradients")]
        assert forward and backward, stage
        assert {n.device for n in mine} == {device}, stage
    # Each stage's optimizer update runs where its weights live.
    updates = {n.device for n in nodes if n.op == "ResourceApplyGradientDescent"
               or n.op == "AssignSubVariableOp"}
    assert set(partitioned.devices) <= updates


def test_branches_on_different_devices(rng):
    model = two_branches()
    reference = copy_of(model)
    split = [["left_a", "left_b"], ["right", "merge", "head"]]
    partitioned = multigpu.model_parallel(model, devices=2, split=split)
    assert [variable_device(v)
            for v in partitioned.template.get_layer("right").weights] == (
        [DEVICES[1]] * 2)
    x, y = data(rng, 9)
    np.testing.assert_allclose(
        partitioned.predict(x, verbose=0), reference.predict(x, verbose=0),
        atol=TOL)
    partitioned.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    _, nodes = executed_nodes(partitioned.train_on_batch, x, y)
    sgd_step(reference, x, y)
    assert_same_weights(partitioned.template, reference)
    left = {n.device for n in nodes if "/left_" in n.name and "MatMul" in n.op}
    right = {n.device for n in nodes if "/right" in n.name and "MatMul" in n.op}
    assert left == {DEVICES[0]} and right == {DEVICES[1]}


# 2 rows (fewer than the micro-batches) in the gate; 10 in the full tier.
@pytest.mark.parametrize("rows", [pytest.param(10, marks=pytest.mark.full), 2])
def test_microbatches_equal_the_unpipelined_step(rng, rows):
    # rows=2 with 3 micro-batches leaves one micro-batch empty.
    model = deep_mlp()
    reference = copy_of(model)
    partitioned = multigpu.model_parallel(model, devices=4, microbatches=3)
    x, y = data(rng, rows)
    np.testing.assert_allclose(
        partitioned.predict(x, verbose=0), reference.predict(x, verbose=0),
        atol=TOL)
    partitioned.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    _, nodes = executed_nodes(partitioned.train_on_batch, x, y)
    sgd_step(reference, x, y)
    assert_same_weights(partitioned.template, reference)
    assert partitioned.optimizer.iterations.numpy() == 1  # one step a batch
    for m in range(3):
        # Lowered control flow (the cond on an empty micro-batch) copies its pivot
        # constants to consumers' devices: routing, not stage work.
        assert {n.device for n in nodes if n.op not in PLUMBING_OPS
                and f"/microbatch{m}/stage3/" in n.name
                and "/pivot_" not in n.name} == {DEVICES[3]}


def skip_and_batch_norm():
    """Dense layers joined by a skip connection, then BatchNormalization:
    Keras's TensorFlow `Add` and BatchNormalization both fail to trace on a
    static batch of 0 rows."""
    inputs = keras.Input((5,), name="features")
    hidden = keras.layers.Dense(5, activation="tanh", name="d0")(inputs)
    skip = keras.layers.Add(name="skip")([inputs, hidden])
    normed = keras.layers.BatchNormalization(name="bn")(skip)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(normed),
                       name="skip_and_batch_norm")


def convolution_and_batch_norm():
    """A convolution, then BatchNormalization: at run time, on 0 rows,
    oneDNN's kernels report "Incompatible shapes: [2] vs. [0,6,6,3]"."""
    inputs = keras.Input((6, 6, 3), name="image")
    conv = keras.layers.Conv2D(2, 3, padding="same", name="conv")(inputs)
    normed = keras.layers.BatchNormalization(name="bn")(conv)
    flat = keras.layers.Flatten(name="flat")(normed)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(flat),
                       name="convolution_and_batch_norm")


ZERO_ROW_MODELS = {
    "skip_and_batch_norm": (skip_and_batch_norm,
                            [["d0"], ["skip", "bn", "head"]]),
    "convolution_and_batch_norm": (convolution_and_batch_norm,
                                   [["conv", "bn"], ["flat", "head"]]),
}


@pytest.mark.parametrize("name", sorted(ZERO_ROW_MODELS))
@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_batch_of_0_rows_predicts_0_rows(rng, microbatches, name):
    build, split = ZERO_ROW_MODELS[name]
    model = build()
    partitioned = multigpu.model_parallel(
        model, split=split, microbatches=microbatches)
    empty = np.zeros((0,) + tuple(model.input_shape[1:]), "float32")
    assert partitioned.predict_on_batch(empty).shape == (0, 3)
    x = rng.standard_normal((4,) + empty.shape[1:]).astype("float32")
    reference = copy_of(model)
    np.testing.assert_allclose(partitioned.predict_on_batch(x),
                               reference.predict_on_batch(x), atol=TOL)
    # A third batch size: Keras traces the predict function again with the
    # batch size unknown, so the 0 rows are seen only when the step runs.
    np.testing.assert_allclose(partitioned.predict_on_batch(x[:3]),
                               reference.predict_on_batch(x[:3]), atol=TOL)
    assert partitioned.predict_on_batch(empty).shape == (0, 3)


# Full tier: the gate fits and evaluates model_parallel in the shape zoo and the tests above.
@pytest.mark.full
def test_fit_evaluate_and_template_hold_the_trained_weights(rng):
    model = deep_mlp()
    reference = copy_of(model)
    initial = model.get_weights()
    partitioned = multigpu.model_parallel(model, devices=3, microbatches=2)
    x, y = data(rng, 24)
    for m in (partitioned, reference):
        m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse",
                  metrics=["mae"])
    partitioned.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    reference.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    assert_same_weights(partitioned.template, reference)
    np.testing.assert_allclose(
        partitioned.evaluate(x, y, verbose=0),
        reference.evaluate(x, y, verbose=0), atol=TOL)
    # The template holds the trained weights; the user's model is untouched.
    assert max_weight_difference(partitioned.template, model) > 1e-3
    for before, after in zip(initial, model.get_weights()):
        np.testing.assert_array_equal(before, after)


def test_save_writes_a_plain_model_that_loads_without_multigpu(rng, tmp_path):
    model = two_branches()
    partitioned = multigpu.model_parallel(model, devices=2)
    x, y = data(rng, 8)
    sgd_step(partitioned, x, y)
    path = tmp_path / "partitioned.keras"
    partitioned.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(model)  # a plain functional model
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]
    np.testing.assert_allclose(loaded.predict(x, verbose=0),
                               partitioned.predict(x, verbose=0), atol=TOL)
    weights = tmp_path / "w.weights.h5"
    partitioned.save_weights(weights)
    fresh = multigpu.model_parallel(two_branches(), devices=2)
    fresh.load_weights(weights)
    assert_same_weights(fresh.template, partitioned.template)


def test_sequential_saves_as_sequential(tmp_path):
    partitioned = multigpu.model_parallel(deep_mlp(), devices=2)
    partitioned.save(tmp_path / "seq.keras")
    assert type(keras.models.load_model(tmp_path / "seq.keras")) is (
        keras.Sequential)


def test_config_round_trip_replaces_weights_on_stage_devices(rng):
    partitioned = multigpu.model_parallel(deep_mlp(), devices=2, split=["d3"])
    clone = multigpu.PartitionedModel.from_config(partitioned.get_config())
    assert clone.stages == partitioned.stages
    assert {variable_device(v)
            for v in clone.template.get_layer("out").weights} == {DEVICES[1]}


def test_jit_compile_is_refused_with_a_warning():
    partitioned = multigpu.model_parallel(deep_mlp(), devices=2)
    with pytest.warns(UserWarning, match="jit_compile=True ignored"):
        partitioned.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert partitioned.jit_compile is False


# --- errors ------------------------------------------------------------------


def test_more_stages_than_layers():
    with pytest.raises(ValueError, match=r"4 stages .* only 2 layer"):
        multigpu.model_parallel(deep_mlp(widths=(4,)), devices=4)


def test_unknown_layer_name_lists_the_layers():
    with pytest.raises(ValueError, match=r"unknown layer name 'nope'.*'d0'"):
        multigpu.model_parallel(deep_mlp(), devices=2, split=["nope"])


def test_layer_inside_a_nested_model_cannot_start_a_stage():
    inner = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4, name="inner_dense"),
         keras.layers.Dense(4, name="inner_2")], name="encoder")
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(2, name="top")(inner(inputs))
    model = keras.Model(inputs, outputs)
    with pytest.raises(ValueError, match=r"inside the nested .*'encoder'"):
        multigpu.model_parallel(model, devices=2, split=["inner_2"])
    partitioned = multigpu.model_parallel(model, devices=2)
    assert partitioned.stages == [["encoder"], ["top"]]


def test_devices_that_do_not_exist():
    with pytest.raises(ValueError, match=r"Unknown device"):
        multigpu.model_parallel(deep_mlp(), devices=["/cpu:0", "/cpu:9"])
    with pytest.raises(ValueError, match=r"only 4 logical CPU"):
        multigpu.model_parallel(deep_mlp(), devices=5)


def test_graph_that_cannot_be_cut_where_asked_says_why():
    # A shared layer reused after a later stage's layer: stage 0 would need
    # stage 1's output.
    inputs = keras.Input((4,))
    shared = keras.layers.Dense(4, name="shared")
    middle = keras.layers.Dense(4, name="middle")
    outputs = shared(middle(shared(inputs)))
    model = keras.Model(inputs, outputs)
    with pytest.raises(ValueError, match=r"cannot be cut there.*'shared'.*"
                       r"reads the output of layer 'middle'"):
        multigpu.model_parallel(model, devices=2, split=["middle"])
    with pytest.raises(ValueError, match=r"cannot be cut there.*'head'"):
        multigpu.model_parallel(two_branches(), devices=2, split=[
            ["head", "left_a", "left_b"], ["right", "merge"]])


def test_masks_cannot_cross_a_stage_boundary():
    inputs = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True, name="emb")(inputs)
    encoded = keras.layers.GRU(3, name="gru")(embedded)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(encoded))
    with pytest.raises(ValueError, match=r"carries a Keras mask"):
        multigpu.model_parallel(model, devices=2, split=["gru"])
    partitioned = multigpu.model_parallel(model, devices=2, split=["head"])
    x = np.array([[1, 2, 0, 0, 0], [3, 0, 0, 0, 0]], "int32")
    np.testing.assert_allclose(partitioned.predict(x, verbose=0),
                               model.predict(x, verbose=0), atol=TOL)


@pytest.mark.parametrize("split, message", [
    (["d3", "d1"], r"distinct, after the first layer and in the order"),
    (["d1"], r"1 start point\(s\) for 3 stages"),
    ([["d0"], ["d1", "d2"]], r"layer\(s\) \['d3', 'out'\] are in no group"),
    ([["d0", "d1"], ["d1", "d2", "d3", "out"]], r"'d1' is listed in groups"),
    ([0, "d2"], r"input 'input_layer"),
])
def test_invalid_splits(split, message):
    model = deep_mlp()
    devices = 3 if split in (["d1"], ["d3", "d1"]) else 2
    if split == [0, "d2"]:
        model = keras.Model(model.inputs, model.outputs)  # has an InputLayer
    with pytest.raises(ValueError, match=message):
        multigpu.model_parallel(model, devices=devices, split=split)


def test_invalid_types_and_microbatches():
    with pytest.raises(TypeError, match=r"Invalid `model`"):
        multigpu.model_parallel("model", devices=2)
    with pytest.raises(TypeError, match=r"Invalid `split`: received 'd1'"):
        multigpu.model_parallel(deep_mlp(), devices=2, split="d1")
    with pytest.raises(ValueError, match=r"Invalid `microbatches`: received 0"):
        multigpu.model_parallel(deep_mlp(), devices=2, microbatches=0)
    fixed = keras.Sequential([keras.Input(batch_shape=(4, 8)),
                              keras.layers.Dense(2), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"fixed batch size"):
        multigpu.model_parallel(fixed, devices=2, microbatches=2)
    assert multigpu.model_parallel(fixed, devices=2).stages == [
        [fixed.layers[0].name], [fixed.layers[1].name]]


def test_saved_partitioned_model_keeps_compile_and_optimizer_state(rng, tmp_path):
    partitioned = multigpu.model_parallel(deep_mlp(), devices=2)
    partitioned.compile(optimizer="adam", loss="mse")
    partitioned.fit(*data(rng, 16), epochs=2, batch_size=8, verbose=0)
    assert partitioned.template.optimizer is partitioned.optimizer
    partitioned.save(tmp_path / "partitioned.keras")
    loaded = keras.models.load_model(tmp_path / "partitioned.keras")
    assert loaded.compiled and int(loaded.optimizer.iterations) == 4


def stem_and_branches():
    """A stem feeding two branches, merged, then a head.

    Split between the branches, the stem's output reaches a later stage
    both directly and through an earlier one.
    """
    inputs = keras.Input((6,), name="features")
    stem = keras.layers.Dense(8, activation="tanh", name="stem")(inputs)
    left = keras.layers.Dense(8, activation="tanh", name="left1")(stem)
    left = keras.layers.Dense(8, activation="tanh", name="left2")(left)
    right = keras.layers.Dense(8, activation="tanh", name="right1")(stem)
    right = keras.layers.Dense(8, activation="tanh", name="right2")(right)
    merged = keras.layers.Concatenate(name="cat")([left, right])
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(merged),
                       name="stem_and_branches")


@pytest.mark.parametrize("split, microbatches", [
    (["left1", "right1"], 1),                 # stem | left1 | the rest
    (["left1", "right1", "cat"], 2),          # 4 stages
    ([["stem"], ["left1", "left2"], ["right1", "right2", "cat", "head"]], 1),
    ([["stem"], ["left1", "left2"], ["right1", "right2", "cat", "head"]], 3),
])
def test_gradients_meeting_at_a_stage_boundary_are_summed_once(
        rng, split, microbatches):
    # The last stage reads the stem's output both directly and through
    # left2 of an earlier stage: the stem's gradient is the sum of both
    # branches, each counted once.
    model = stem_and_branches()
    reference = copy_of(model)
    partitioned = multigpu.model_parallel(model, split=split,
                                          microbatches=microbatches)
    x = rng.standard_normal((12, 6)).astype("float32")
    y = rng.standard_normal((12, 2)).astype("float32")
    sgd_step(partitioned, x, y)
    sgd_step(reference, x, y)
    assert_same_weights(partitioned.template, reference)


def test_outputs_with_a_shared_name_are_named_apart():
    from support.models import zoo_siamese

    partitioned = multigpu.model_parallel(zoo_siamese(), devices=2)
    assert partitioned.output_names == ["add", "nested", "nested_1"]


def test_subclassed_models_are_refused_with_the_reason():
    from support.models import zoo_subclassed

    with pytest.raises(ValueError, match=(
            r"'zoo_subclassed' has no symbolic inputs: it is a subclassed "
            r"model, whose call\(\) is code rather than a graph of layers.*"
            r"multigpu.multi_gpu_model\(\) also takes")):
        multigpu.model_parallel(zoo_subclassed(), devices=2)


def test_sequential_built_by_a_call_is_cut_into_stages(rng):
    model = keras.Sequential([keras.layers.Dense(5, name="a"),
                              keras.layers.Dense(3, name="b")])
    x, y = data(rng, 6)
    model(x)  # fixes a batch size of 6 in its graph
    reference = copy_of(model)
    partitioned = multigpu.model_parallel(model, devices=2)
    assert partitioned.stages == [["a"], ["b"]]
    sgd_step(partitioned, x, y)
    sgd_step(reference, x, y)
    assert_same_weights(partitioned.template, reference)
