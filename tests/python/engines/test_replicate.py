"""multi_gpu_model: numbers equal the template's, on every model shape."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multigpu
from multigpu.engines.tensorflow.forward import split_bounds
from support.models import copy_of, data, images, max_weight_difference, mlp, pooled_cnn

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]

TOLERANCE = 1e-5


def sgd_step_pair(template, parallel, x, y, loss="mse"):
    """Compiles both with the same SGD and runs one full-batch step each."""
    for model in (template, parallel):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    reference_loss = template.train_on_batch(x, y)
    parallel_loss = parallel.train_on_batch(x, y)
    return reference_loss, parallel_loss


@pytest.mark.parametrize("rows, replicas, sizes", [
    (10, 4, [2, 3, 2, 3]), (64, 2, [32, 32]), (3, 4, [0, 1, 1, 1]),
    (1, 4, [0, 0, 0, 1]), (0, 2, [0, 0]),
])
def test_split_keeps_every_row(rows, replicas, sizes):
    bounds = split_bounds(rows, replicas)
    assert [b - a for a, b in zip(bounds, bounds[1:])] == sizes
    assert bounds[0] == 0 and bounds[-1] == rows


def test_batch_split_reports_rows_per_device():
    parallel = multigpu.multi_gpu_model(mlp(), gpus=4)
    assert parallel.batch_split(256) == [
        (f"/device:CPU:{i}", 64) for i in range(4)]


@pytest.mark.parametrize("rows", [64, 10, 3, 1])
@pytest.mark.parametrize("gpus", [2, 4, ["/cpu:3", "/cpu:1"]])
def test_predictions_equal_the_template(rng, rows, gpus):
    template = mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=gpus)
    x, _ = data(rng, rows)
    np.testing.assert_allclose(
        parallel.predict(x, verbose=0), template.predict(x, verbose=0),
        atol=TOLERANCE)
    np.testing.assert_allclose(parallel(x), template(x), atol=TOLERANCE)


@pytest.mark.parametrize("rows", [16, 10, 3, 1])
@pytest.mark.parametrize("cpu_merge", [True, False])
def test_one_sgd_step_equals_one_template_step(rng, rows, cpu_merge):
    template = mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=4, cpu_merge=cpu_merge)
    x, y = data(rng, rows)
    reference_loss, parallel_loss = sgd_step_pair(reference, parallel, x, y)
    assert parallel_loss == pytest.approx(reference_loss, abs=TOLERANCE)
    assert max_weight_difference(template, reference) < TOLERANCE
    assert max_weight_difference(template, mlp()) > 1e-3  # it did train


def test_epochs_with_a_short_last_batch_match_the_template(rng):
    template = mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    x, y = data(rng, 23)  # batches of 7, 7, 7, 2
    for model in (reference, parallel):
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    ref = reference.fit(x, y, batch_size=7, epochs=2, shuffle=False, verbose=0)
    par = parallel.fit(x, y, batch_size=7, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(par.history["loss"], ref.history["loss"],
                               atol=TOLERANCE)
    assert max_weight_difference(template, reference) < TOLERANCE


def test_replicas_share_the_template_weights(rng):
    template = mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=2)
    assert parallel.template is template
    assert [id(w) for w in parallel.weights] == [id(w) for w in template.weights]
    before = template.get_weights()
    parallel.compile(optimizer="adam", loss="mse")
    parallel.fit(*data(rng, 32), epochs=1, verbose=0)
    changed = [not np.allclose(a, b) for a, b in zip(before, template.get_weights())]
    assert all(changed)


def test_cpu_merge_options_give_the_same_numbers(rng):
    template = mlp()
    x, y = data(rng, 10)
    results = []
    for cpu_merge in (True, False):
        model = copy_of(template)
        parallel = multigpu.multi_gpu_model(model, gpus=3, cpu_merge=cpu_merge)
        assert parallel.merge_device == (
            "/device:CPU:0" if cpu_merge else parallel.devices[0])
        sgd_step_pair(copy_of(template), parallel, x, y)
        results.append((parallel.predict(x, verbose=0), model.get_weights()))
    np.testing.assert_allclose(results[0][0], results[1][0], atol=TOLERANCE)
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, atol=TOLERANCE)


def test_cpu_relocation_keeps_trained_weights(rng):
    """keras-team/keras#11313: the original re-initialised the weights."""
    model = mlp()
    x, y = data(rng, 32)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, epochs=3, verbose=0)
    parallel = multigpu.multi_gpu_model(model, gpus=4, cpu_relocation=True)
    assert parallel.template is not model
    assert max_weight_difference(parallel.template, model) == 0.0
    assert all(w.value.device.endswith("device:CPU:0")
               for w in parallel.template.weights)
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               model.predict(x, verbose=0), atol=TOLERANCE)
    reference = copy_of(model)
    sgd_step_pair(reference, parallel, x, y)
    assert max_weight_difference(parallel.template, reference) < TOLERANCE


def two_in_two_out():
    image = keras.Input((6,), name="image")
    meta = keras.Input((2,), name="meta")
    joined = keras.layers.Concatenate()([
        keras.layers.Dense(8, activation="relu")(image), meta])
    label = keras.layers.Dense(3, activation="softmax", name="label")(joined)
    score = keras.layers.Dense(1, name="score")(joined)
    return keras.Model([image, meta], [label, score])


def test_multi_input_multi_output_keeps_output_names(rng):
    template = two_in_two_out()
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    assert parallel.output_names == ["label", "score"]
    x = [rng.standard_normal((11, 6)).astype("float32"),
         rng.standard_normal((11, 2)).astype("float32")]
    y = {"label": keras.utils.to_categorical(rng.integers(0, 3, 11), 3),
         "score": rng.standard_normal((11, 1)).astype("float32")}
    for got, want in zip(parallel.predict(x, verbose=0),
                         template.predict(x, verbose=0)):
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
    reference = copy_of(template)
    losses = {"label": "categorical_crossentropy", "score": "mse"}
    ref_loss, par_loss = sgd_step_pair(reference, parallel, x, y, loss=losses)
    np.testing.assert_allclose(par_loss, ref_loss, atol=TOLERANCE)
    assert max_weight_difference(template, reference) < TOLERANCE


def test_dict_inputs_and_outputs(rng):
    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b")
    h = keras.layers.Concatenate()([a, b])
    template = keras.Model({"a": a, "b": b}, {
        "first": keras.layers.Dense(1, name="d1")(h),
        "second": keras.layers.Dense(2, name="d2")(h)})
    parallel = multigpu.multi_gpu_model(template, gpus=3)
    x = {"a": rng.standard_normal((7, 3)).astype("float32"),
         "b": rng.standard_normal((7, 2)).astype("float32")}
    got, want = parallel.predict(x, verbose=0), template.predict(x, verbose=0)
    assert set(got) == {"first", "second"}
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=TOLERANCE)
    y = {"first": np.ones((7, 1), "float32"), "second": np.zeros((7, 2), "float32")}
    reference = copy_of(template)
    for model in (parallel, reference):
        model.compile(optimizer="sgd",
                      loss={"first": "mse", "second": "mae"})
    np.testing.assert_allclose(parallel.fit(x, y, verbose=0).history["loss"],
                               reference.fit(x, y, verbose=0).history["loss"],
                               atol=TOLERANCE)
    assert max_weight_difference(template, reference) < TOLERANCE


def test_nested_and_shared_submodels(rng):
    """A siamese model: one encoder (a nested model) used on two inputs."""
    encoder = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4)],
                               name="encoder")
    left, right = keras.Input((5,), name="left"), keras.Input((5,), name="right")
    distance = keras.layers.Subtract()([encoder(left), encoder(right)])
    template = keras.Model([left, right], keras.layers.Dense(1)(distance))
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    x = [rng.standard_normal((9, 5)).astype("float32") for _ in range(2)]
    y = rng.standard_normal((9, 1)).astype("float32")
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOLERANCE)
    reference = copy_of(template)
    sgd_step_pair(reference, parallel, x, y)
    assert max_weight_difference(template, reference) < TOLERANCE


def test_rnn_with_initial_state_inputs(rng):
    sequence = keras.Input((5, 3), name="sequence")
    h0, c0 = keras.Input((4,), name="h0"), keras.Input((4,), name="c0")
    encoded = keras.layers.LSTM(4)(sequence, initial_state=[h0, c0])
    template = keras.Model([sequence, h0, c0], keras.layers.Dense(2)(encoded))
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    x = [rng.standard_normal((6, 5, 3)).astype("float32"),
         rng.standard_normal((6, 4)).astype("float32"),
         rng.standard_normal((6, 4)).astype("float32")]
    y = rng.standard_normal((6, 2)).astype("float32")
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOLERANCE)
    reference = copy_of(template)
    sgd_step_pair(reference, parallel, x, y)
    assert max_weight_difference(template, reference) < TOLERANCE


def batchnorm_model():
    inputs = keras.Input((4,))
    hidden = keras.layers.BatchNormalization(name="bn")(
        keras.layers.Dense(6)(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


@pytest.mark.parametrize("batch_size", [8, 3, 1])
def test_batchnorm_moving_statistics_reach_the_template(rng, batch_size):
    template = batchnorm_model()
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    parallel.compile(optimizer="sgd", loss="mse")
    x = (rng.standard_normal((16, 4)) * 3 + 5).astype("float32")
    parallel.fit(x, np.ones((16, 1), "float32"), batch_size=batch_size,
                 epochs=2, verbose=0)
    moving_mean = template.get_layer("bn").moving_mean.numpy()
    assert np.all(np.isfinite(moving_mean))  # no NaN from empty sub-batches
    assert np.abs(moving_mean).max() > 1e-3
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOLERANCE)


class ArrayBatches(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[rows], self.y[rows]


@pytest.mark.parametrize("source", ["numpy", "tf.data", "PyDataset"])
def test_input_kinds_train_like_the_template(rng, source):
    template = mlp()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    x, y = data(rng, 21)
    inputs = {
        "numpy": lambda: dict(x=x, y=y, batch_size=5),
        "tf.data": lambda: dict(
            x=tf.data.Dataset.from_tensor_slices((x, y)).batch(5)),
        "PyDataset": lambda: dict(x=ArrayBatches(x, y, 5)),
    }[source]
    for model in (reference, parallel):
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        model.fit(epochs=1, verbose=0, shuffle=False, **inputs())
    assert max_weight_difference(template, reference) < TOLERANCE
    assert parallel.evaluate(verbose=0, **inputs()) == pytest.approx(
        reference.evaluate(verbose=0, **inputs()), abs=TOLERANCE)


def test_parallel_model_as_a_layer_of_another_model(rng):
    template = mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=2)
    inputs = keras.Input((8,))
    head = keras.layers.Dense(1, name="head")
    outer = keras.Model(inputs, head(parallel(inputs)))
    x, _ = data(rng, 5)
    np.testing.assert_allclose(
        outer.predict(x, verbose=0), head(template(x)).numpy(), atol=TOLERANCE)
    outer.compile(optimizer="sgd", loss="mse")
    before = template.get_weights()[0].copy()
    outer.fit(x, np.ones((5, 1), "float32"), verbose=0)
    assert not np.allclose(before, template.get_weights()[0])


def test_sequential_template_with_single_device_fallback(rng, monkeypatch):
    from multigpu import devices as devices_lib
    from multigpu.runtime import tensorflow as tensorflow_runtime
    monkeypatch.setattr(tensorflow_runtime, "logical_devices",
                        {"GPU": [], "CPU": ["/device:CPU:0"]}.__getitem__)
    devices_lib.STATE.reset()
    template = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    with pytest.warns(UserWarning, match="Only one device"):
        parallel = multigpu.multi_gpu_model(template)
    assert parallel.devices == ["/device:CPU:0"]
    x, _ = data(rng, 4)
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=TOLERANCE)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


@pytest.mark.parametrize("model, error, message", [
    ("not a model", TypeError, "received an object of type str"),
    (keras.layers.Dense(2), TypeError, "type Dense; expected a keras.Model"),
    (Subclassed(), ValueError,
     r"subclassed model '\w+' has not been built.*model\(x\[:1\]\)"),
    (keras.Sequential([keras.layers.Dense(2)]), ValueError,
     r"Sequential model '\w+' has not been built"),
])
def test_invalid_models_are_refused(model, error, message):
    with pytest.raises(error, match=message):
        multigpu.multi_gpu_model(model, gpus=2)


def test_fixed_batch_size_is_refused():
    inputs = keras.Input(batch_shape=(8, 3))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    with pytest.raises(ValueError, match="fixed batch size"):
        multigpu.multi_gpu_model(model, gpus=2)


@pytest.mark.parametrize("flag", ["cpu_merge", "cpu_relocation"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_flags_must_be_booleans(flag, value):
    with pytest.raises(ValueError, match=f"Invalid `{flag}`: received {value!r}"):
        multigpu.multi_gpu_model(mlp(), gpus=2, **{flag: value})


@pytest.mark.parametrize("flag", ["cpu_merge", "cpu_relocation"])
def test_numpy_bools_are_flags(flag):
    parallel = multigpu.multi_gpu_model(mlp(), gpus=2, **{flag: np.bool_(False)})
    assert isinstance(parallel, multigpu.ParallelModel)


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_a_parallel_model_is_not_replicated_again(engine):
    parallel = multigpu.multi_gpu_model(mlp(), gpus=2, engine=engine)
    with pytest.raises(ValueError, match="is already a parallel model.*`template`"):
        multigpu.multi_gpu_model(parallel, gpus=2)
    partitioned = multigpu.model_parallel(mlp(), devices=2)
    with pytest.raises(ValueError, match="is already a parallel model"):
        multigpu.multi_gpu_model(partitioned, gpus=2)


def test_invalid_gpus_leave_the_model_untouched(rng):
    model = mlp()
    before = model.get_weights()
    with pytest.raises(ValueError, match="received 1"):
        multigpu.multi_gpu_model(model, gpus=1)
    assert max(np.abs(a - b).max() for a, b in zip(before, model.get_weights())) == 0


@pytest.mark.parametrize("rows, batch_size", [(9, 8), (3, 3), (2, 8)])
def test_sub_batches_of_zero_rows_train_like_the_template(rng, rows, batch_size):
    # 9 rows in batches of 8 end with a batch of 1: three of the four
    # devices would get zero rows, which oneDNN's pooled convolutions reject.
    template = pooled_cnn()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    x, y = images(rng, rows)
    histories = []
    for model in (reference, parallel):
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss="sparse_categorical_crossentropy")
        histories.append(model.fit(x, y, batch_size=batch_size, epochs=2,
                                   shuffle=False, verbose=0))
    assert max_weight_difference(template, reference) < TOLERANCE
    np.testing.assert_allclose(histories[1].history["loss"],
                               histories[0].history["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        parallel.predict(x, batch_size=batch_size, verbose=0),
        reference.predict(x, batch_size=batch_size, verbose=0), atol=TOLERANCE)
    assert parallel.evaluate(x, y, batch_size=batch_size, verbose=0) == (
        pytest.approx(reference.evaluate(x, y, batch_size=batch_size,
                                         verbose=0), rel=1e-5))


def test_direct_calls_survive_sub_batches_of_zero_rows(rng):
    # Outside Keras's steps (a custom loop, or the model used as a layer)
    # every replica is ready for an empty share.
    template = pooled_cnn()
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    x, y = images(rng, 2)
    np.testing.assert_allclose(parallel(x), template(x), atol=TOLERANCE)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def gradients(model):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    for got, want in zip(gradients(parallel), gradients(template)):
        np.testing.assert_allclose(got, want, atol=TOLERANCE)


# --- every model shape ------------------------------------------------------


def _siamese_data(rng, rows):
    x = [rng.standard_normal((rows, 3)).astype("float32") for _ in range(2)]
    y = [rng.standard_normal((rows, 1)).astype("float32") for _ in range(3)]
    return x, y


@pytest.mark.parametrize("engine, loss", [
    ("replicate", "mse"),
    ("replicate", ["mse", "mae", "mse"]),
    ("replicate", {"add": "mse", "nested": "mae", "nested_1": "mse"}),
    ("mirrored", {"add": "mse", "nested": "mae", "nested_1": "mse"}),
])
def test_outputs_sharing_a_layer_name_are_named_apart(rng, engine, loss):
    # tf.keras's test_multi_gpu_with_siamese_network: the shared sub-model's
    # output is two of the outputs, both named "nested" by Keras 3.
    from support.models import zoo_siamese

    template = zoo_siamese()
    assert template.output_names == ["add", "nested", "nested"]
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    assert parallel.output_names == ["add", "nested", "nested_1"]
    x, y = _siamese_data(rng, 9)
    for got, want in zip(parallel.predict(x, verbose=0),
                         reference.predict(x, verbose=0)):
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
    parallel.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    as_list = ([loss[k] for k in parallel.output_names]
               if isinstance(loss, dict) else loss)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss=as_list)
    parallel.train_on_batch(x, {n: t for n, t in zip(parallel.output_names, y)}
                            if isinstance(loss, dict) else y)
    reference.train_on_batch(x, y)
    assert max_weight_difference(template, reference) < TOLERANCE


def test_unique_names_keep_first_uses_and_skip_taken_names():
    from multigpu.engines.functional import unique_names

    assert unique_names(["add", "nested", "nested"]) == [
        "add", "nested", "nested_1"]
    assert unique_names(["a", "a", "a_1", "a"]) == ["a", "a_2", "a_1", "a_3"]


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_subclassed_models_train_like_the_template(rng, engine):
    from support.models import zoo_subclassed

    template = zoo_subclassed()
    reference = copy_of(template)
    parallel = multigpu.multi_gpu_model(template, gpus=4, engine=engine)
    x, y = data(rng, 10, input_dim=4, outputs=2)
    np.testing.assert_allclose(parallel.predict(x, batch_size=5, verbose=0),
                               reference.predict(x, verbose=0),
                               atol=TOLERANCE)
    parallel.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    reference.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    parallel.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0)
    reference.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0)
    assert max_weight_difference(template, reference) < TOLERANCE


def test_sequential_built_by_a_call_takes_any_batch_size(rng):
    model = keras.Sequential([keras.layers.Dense(5), keras.layers.Dense(3)])
    x, _ = data(rng, 7)
    model(x)  # builds it, fixing a batch size of 7 in its graph
    parallel = multigpu.multi_gpu_model(model, gpus=2)
    np.testing.assert_allclose(parallel.predict(x[:5], verbose=0),
                               model.predict(x[:5], verbose=0),
                               atol=TOLERANCE)
