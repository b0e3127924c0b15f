"""Saving a parallel model writes the template, which plain Keras loads."""

import keras
import numpy as np
import pytest

import multigpu
from support.models import data, mlp

# The module's tests are one zoo along the engines: the gate runs each
# on one engine, in turn, the full tier on all (support/tiers.py).
pytestmark = [pytest.mark.filterwarnings("ignore:No GPU found"),
              pytest.mark.zoo(axes=("engine",), scope="module")]


@pytest.fixture
def trained(rng):
    template = mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    parallel.compile(optimizer="adam", loss="mse")
    x, y = data(rng, 40)
    parallel.fit(x, y, epochs=2, batch_size=8, verbose=0)
    return parallel, x, y


@pytest.mark.parametrize("filename", ["model.keras", "model.h5"])
def test_save_writes_a_plain_model_that_loads_back(trained, tmp_path, filename):
    parallel, x, _ = trained
    path = tmp_path / filename
    parallel.save(path)
    loaded = keras.models.load_model(path, compile=False)
    assert not isinstance(loaded, multigpu.ParallelModel)
    assert loaded.name == parallel.template.name
    np.testing.assert_allclose(loaded.predict(x, verbose=0),
                               parallel.predict(x, verbose=0), atol=1e-6)


def test_save_weights_round_trip(trained, tmp_path):
    parallel, x, _ = trained
    path = tmp_path / "shared.weights.h5"
    parallel.save_weights(path)
    fresh = mlp()
    fresh.load_weights(path)
    np.testing.assert_allclose(fresh.predict(x, verbose=0),
                               parallel.predict(x, verbose=0), atol=1e-6)
    other = multigpu.multi_gpu_model(mlp(), gpus=2)
    other.load_weights(path)
    np.testing.assert_allclose(other.predict(x, verbose=0),
                               parallel.predict(x, verbose=0), atol=1e-6)


@pytest.mark.parametrize("engine", ["replicate", "mirrored"])
def test_weights_keras_saves_from_the_parallel_model_load_back(
        rng, tmp_path, engine):
    # keras.Model.save_weights(model, ...), as keras3's save_model_weights()
    # calls it, writes the parallel model's own structure, not the template's.
    template = mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=2, engine=engine)
    parallel.compile(optimizer="adam", loss="mse")
    x, y = data(rng, 16)
    parallel.fit(x, y, epochs=1, batch_size=8, verbose=0)
    path = tmp_path / "parallel.weights.h5"
    keras.Model.save_weights(parallel, path)
    trained = parallel.predict(x, verbose=0)
    template.set_weights([np.zeros_like(w) for w in template.get_weights()])
    parallel.load_weights(path)
    np.testing.assert_allclose(parallel.predict(x, verbose=0), trained,
                               atol=1e-6)
    np.testing.assert_allclose(template.predict(x, verbose=0), trained,
                               atol=1e-6)


@pytest.mark.parametrize("weights_only", [False, True])
def test_model_checkpoint_attached_to_the_parallel_model(
        rng, tmp_path, weights_only):
    parallel = multigpu.multi_gpu_model(mlp(), gpus=3)
    parallel.compile(optimizer="adam", loss="mse")
    suffix = ".weights.h5" if weights_only else ".keras"
    pattern = str(tmp_path / ("ckpt-{epoch}" + suffix))
    checkpoint = keras.callbacks.ModelCheckpoint(
        pattern, save_weights_only=weights_only)
    x, y = data(rng, 30)
    parallel.fit(x, y, epochs=2, batch_size=7, callbacks=[checkpoint], verbose=0)
    last = tmp_path / ("ckpt-2" + suffix)
    if weights_only:
        loaded = mlp()
        loaded.load_weights(last)
    else:
        loaded = keras.models.load_model(last)
    np.testing.assert_allclose(loaded.predict(x, verbose=0),
                               parallel.predict(x, verbose=0), atol=1e-6)


def test_outer_model_holding_a_parallel_model_round_trips(rng, tmp_path):
    parallel = multigpu.multi_gpu_model(mlp(), gpus=2)
    inputs = keras.Input((8,))
    outer = keras.Model(inputs, keras.layers.Dense(1)(parallel(inputs)))
    path = tmp_path / "outer.keras"
    keras.saving.save_model(outer, path)
    loaded = keras.models.load_model(path)
    x, _ = data(rng, 6)
    np.testing.assert_allclose(loaded.predict(x, verbose=0),
                               outer.predict(x, verbose=0), atol=1e-6)
    inner = [layer for layer in loaded.layers if isinstance(layer, multigpu.ParallelModel)]
    assert inner and inner[0].devices == parallel.devices


def test_saved_model_resumes_with_compile_config_and_optimizer_state(
        trained, tmp_path):
    parallel, x, y = trained
    path = tmp_path / "resume.keras"
    parallel.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.compiled
    assert int(loaded.optimizer.iterations) == int(parallel.optimizer.iterations) == 10
    for saved, live in zip(loaded.optimizer.variables, parallel.optimizer.variables):
        np.testing.assert_allclose(saved.numpy(), live.numpy(), atol=1e-7)
    assert loaded.evaluate(x, y, verbose=0) == pytest.approx(
        parallel.evaluate(x, y, verbose=0), abs=1e-6)


def test_compile_shares_the_optimizer_with_the_template(rng):
    template = mlp()
    parallel = multigpu.multi_gpu_model(template, gpus=2)
    parallel.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    assert template.optimizer is parallel.optimizer
    x, y = data(rng, 12)
    parallel.fit(x, y, verbose=0)
    np.testing.assert_allclose(template.evaluate(x, y, verbose=0),
                               parallel.evaluate(x, y, verbose=0), atol=1e-6)
    parallel.compile(optimizer="adam", loss="mae")  # recompiling follows
    assert template.optimizer is parallel.optimizer


def test_a_template_compiled_before_saves_the_optimizer_that_trained(
        rng, tmp_path):
    """make_or_restore_model's build_fn compiles the template first."""
    template = mlp()
    template.compile(optimizer="rmsprop", loss="mae")
    parallel = multigpu.multi_gpu_model(template, gpus=2)
    parallel.compile(optimizer="adam", loss="mse")
    assert template.optimizer is parallel.optimizer
    parallel.fit(*data(rng, 16), epochs=2, batch_size=8, verbose=0)
    parallel.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert int(loaded.optimizer.iterations) == 4
    assert loaded.optimizer.__class__.__name__ == "Adam"


def test_cnn_batches_smaller_than_the_replica_count_train(rng):
    """Empty sub-batches must not reach backward kernels (oneDNN aborts)."""
    template = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
        keras.layers.Dropout(0.2), keras.layers.Dense(3)])
    parallel = multigpu.multi_gpu_model(template, gpus=4)
    parallel.compile(optimizer="sgd", loss="mse")
    x = rng.random((3, 8, 8, 1)).astype("float32")
    before = template.get_weights()
    loss = parallel.train_on_batch(x, rng.random((3, 3)).astype("float32"))
    assert np.isfinite(loss)
    # Dropout's draws on 4 devices are not those of one: no reference to
    # train beside it. The step reached the template, which predicts
    # (dropout off) what the parallel model predicts.
    assert max(np.abs(w - b).max() for w, b in
               zip(template.get_weights(), before)) > 0
    np.testing.assert_allclose(parallel.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=1e-6)


@pytest.mark.parametrize("loss, metrics", [
    ("mse", ["mae"]), ("mean_squared_error", ["mae", "mse"]),
    ({"scores": "mse"}, {"scores": ["mae"]})])
def test_hdf5_with_loss_aliases_loads_compiled_with_optimizer_state(
        trained, tmp_path, loss, metrics):
    """Keras 3.15 refuses `loss="mse"` in legacy .h5 files compiled."""
    parallel, x, y = trained
    parallel.compile(optimizer="adam", loss=loss, metrics=metrics)
    parallel.fit(x, y, epochs=1, batch_size=8, verbose=0)
    path = tmp_path / "model.h5"
    parallel.save(path)
    loaded = multigpu.load_model(path)
    assert loaded.compiled
    assert int(loaded.optimizer.iterations) == int(parallel.optimizer.iterations)
    for saved, live in zip(loaded.optimizer.variables, parallel.optimizer.variables):
        np.testing.assert_allclose(saved.numpy(), live.numpy(), atol=1e-7)
    np.testing.assert_allclose(loaded.evaluate(x, y, verbose=0),
                               parallel.evaluate(x, y, verbose=0), atol=1e-6)
    assert multigpu.load_model(path, compile=False).compiled is False


def _engine_model(engine, template):
    if engine == "model_parallel":
        return multigpu.model_parallel(template, devices=2)
    return multigpu.multi_gpu_model(template, gpus=2, engine=engine)


@pytest.mark.parametrize("engine, loss, metrics", [
    ("replicate", "mse", ["mae"]),
    ("mirrored", "mae", ["mse", "accuracy"]),
    ("model_parallel", {"scores": "msle"}, {"scores": ["mape"]})])
def test_hdf5_files_load_compiled_with_stock_keras(rng, tmp_path, engine,
                                                   loss, metrics):
    # Keras 3.15 writes the aliases and cannot read them back; the package
    # writes names Keras's own loader reads.
    parallel = _engine_model(engine, mlp())
    parallel.compile(optimizer="adam", loss=loss, metrics=metrics)
    x, y = data(rng, 16)
    parallel.fit(x, y, epochs=1, batch_size=8, verbose=0)
    path = tmp_path / "model.h5"
    parallel.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.compiled
    assert int(loaded.optimizer.iterations) == 2
    template = parallel.template
    for saved, live in zip(loaded.optimizer.variables,
                           template.optimizer.variables):
        np.testing.assert_allclose(saved.numpy(), np.asarray(live),
                                   atol=1e-7)
    np.testing.assert_allclose(loaded.predict(x, verbose=0),
                               template.predict(x, verbose=0), atol=1e-6)
    got = loaded.evaluate(x, y, verbose=0, return_dict=True)
    want = template.evaluate(x, y, verbose=0, return_dict=True)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-6)


def test_save_model_writes_plain_models_stock_keras_loads(rng, tmp_path):
    model = mlp()
    model.compile(optimizer="sgd", loss="mse", metrics=["mae", "msle"])
    model.fit(*data(rng, 8), epochs=1, verbose=0)
    multigpu.save_model(model, tmp_path / "plain.h5")
    loaded = keras.models.load_model(tmp_path / "plain.h5")
    assert loaded.compiled and int(loaded.optimizer.iterations) == 1
    multigpu.save_model(model, tmp_path / "plain.keras")
    assert keras.models.load_model(tmp_path / "plain.keras").compiled


def test_loadable_training_config_names_aliases_canonically():
    from multigpu.saving import loadable_training_config

    config = loadable_training_config({
        "loss": {"a": "mse", "b": "mean_absolute_error"},
        "metrics": [["mae", "accuracy"], ["acc"]],
        "weighted_metrics": None, "loss_weights": None,
    })
    assert config["loss"] == {"a": "mean_squared_error",
                              "b": "mean_absolute_error"}
    assert config["metrics"][0][0]["class_name"] == "MeanAbsoluteError"
    assert config["metrics"][0][0]["config"]["name"] == "mae"
    assert config["metrics"][0][1:] == ["accuracy"]
    assert config["metrics"][1] == ["acc"]


@pytest.mark.parametrize("content", [b"garbage", b""])
def test_a_file_that_is_no_model_is_named_not_reported_missing(tmp_path, content):
    path = tmp_path / "broken.keras"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="broken.keras.*is not a Keras model file"):
        multigpu.load_model(path)


@pytest.mark.parametrize("filepath, error, message", [
    (None, TypeError, r"`filepath`: received None; expected the path of a "
                      r"saved model file"),
    (3, TypeError, r"`filepath`: received 3; expected the path"),
    ("", ValueError, r"`filepath`: received ''; expected the path"),
])
def test_load_model_of_no_path_is_named(filepath, error, message):
    with pytest.raises(error, match=message):
        multigpu.load_model(filepath)


def test_load_model_in_r_spells_null():
    from multigpu.messages import language

    with language("r"), pytest.raises(TypeError, match="received NULL"):
        multigpu.load_model(None)


def test_load_model_of_a_directory_names_the_files_in_it(tmp_path):
    with pytest.raises(ValueError, match=(
            r"`filepath`: received '.*', which is a directory; expected a "
            r"saved model file.*Pass the path of a file written by saving")):
        multigpu.load_model(tmp_path)
    (tmp_path / "ckpt-1.keras").write_bytes(b"")
    (tmp_path / "ckpt-2.keras").write_bytes(b"")
    with pytest.raises(ValueError, match=(
            r"is a directory.*It holds the model files 'ckpt-1.keras', "
            r"'ckpt-2.keras': pass one of them")):
        multigpu.load_model(str(tmp_path))
    saved_model = tmp_path / "exported"
    saved_model.mkdir()
    (saved_model / "saved_model.pb").write_bytes(b"")
    with pytest.raises(ValueError, match=r"SavedModel.*keras.layers.TFSMLayer"):
        multigpu.load_model(saved_model)
