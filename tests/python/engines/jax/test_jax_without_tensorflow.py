"""On JAX, multigpu runs in a Python where TensorFlow cannot be imported.

`pip install "multigpu[jax]"` installs no TensorFlow. One fresh process,
started as the workers are (`support.worker_scripts.fresh_python`), marks
TensorFlow missing before anything imports it
(`_common.hide_optional_packages`), then trains with `multi_gpu_model` on
NumPy arrays, a `keras.utils.PyDataset` and a generator beside plain Keras
on one device, predicts, saves and loads, stops on a NaN batch, resumes
from `checkpoint_callbacks`, trains and saves a `model_parallel` model
(its weights split across the devices), and calls what needs TensorFlow. The static
half of the promise (no module the JAX path imports reaches TensorFlow) is
`tests/python/test_layout.py`.
"""

import json
import os
import subprocess

from support.worker_scripts import fresh_python

_CHILD = r'''
import json, sys, tempfile
hidden = _common.hide_optional_packages(("tensorflow",))
assert hidden == ("tensorflow",), hidden

import multigpu
multigpu.virtual_devices(2)
import keras
import numpy as np

TOL = 1e-5
found = {}


def mlp():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)),
                             keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3)])


rng = np.random.default_rng(0)
x = rng.standard_normal((21, 6)).astype("float32")
y = rng.standard_normal((21, 3)).astype("float32")


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 3

    def __getitem__(self, i):
        return x[7 * i:7 * (i + 1)], y[7 * i:7 * (i + 1)]


def generator():
    for i in range(4):  # 6, 6, 6 and 3 rows: the last split unevenly
        yield x[6 * i:6 * (i + 1)], y[6 * i:6 * (i + 1)]


template, reference = mlp(), mlp()
reference.set_weights(template.get_weights())
parallel = multigpu.multi_gpu_model(template, gpus=2)
found["engine"] = parallel.engine
for model in (parallel, reference):
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    model.fit(Batches(), epochs=1, shuffle=False, verbose=0)
    model.fit(generator(), epochs=1, verbose=0)
found["weights"] = max(float(np.abs(a - b).max()) for a, b in
                       zip(template.get_weights(), reference.get_weights()))
found["predict"] = float(np.abs(parallel.predict(x, verbose=0)
                                - reference.predict(x, verbose=0)).max())

folder = tempfile.mkdtemp()
parallel.save(f"{folder}/parallel.keras")
parallel.save_weights(f"{folder}/parallel.weights.h5")
multigpu.save_model(template, f"{folder}/template.keras")
expected = reference.predict(x, verbose=0)
found["loaded"] = max(
    float(np.abs(loaded.predict(x, verbose=0) - expected).max())
    for loaded in (keras.models.load_model(f"{folder}/parallel.keras"),
                   multigpu.load_model(f"{folder}/template.keras")))
again = multigpu.multi_gpu_model(mlp(), gpus=2)
again.load_weights(f"{folder}/parallel.weights.h5")
found["load_weights"] = float(np.abs(again.predict(x, verbose=0) - expected).max())

bad = x.copy()
bad[9, 2] = np.nan
try:
    parallel.fit(bad, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    found["guard"] = None
except multigpu.NonFiniteInputError as error:
    found["guard"] = [error.epoch, error.step]
# One device trains the batch before the bad one, and nothing else.
reference.fit(x[:8], y[:8], batch_size=8, shuffle=False, verbose=0)
found["guard_weights"] = max(
    float(np.abs(a - b).max())
    for a, b in zip(template.get_weights(), reference.get_weights()))

checkpoints = f"{folder}/checkpoints"
parallel.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
             callbacks=multigpu.checkpoint_callbacks(checkpoints))
restored = multigpu.make_or_restore_model(checkpoints, mlp)
found["restored"] = float(np.abs(restored.predict(x, verbose=0)
                                 - template.predict(x, verbose=0)).max())

# model_parallel: the weights split across both devices, one device's numbers.
sharded, alone = multigpu.model_parallel(mlp(), devices=2), mlp()
for model in (sharded, alone):
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
sharded.save(f"{folder}/sharded.keras")
found["model_parallel"] = max(
    float(np.abs(model.predict(x, verbose=0) - alone.predict(x, verbose=0)).max())
    for model in (sharded, keras.models.load_model(f"{folder}/sharded.keras")))

refusals = {}
for name, call in [
        ("mirrored_strategy", lambda: multigpu.mirrored_strategy()),
        ("fit_distributed", lambda: multigpu.fit_distributed(parallel, None)),
        ("MirroredModel", lambda: multigpu.MirroredModel(template, ["a"]))]:
    try:
        call()
        refusals[name] = None
    except ModuleNotFoundError as error:
        refusals[name] = [error.name, str(error)]
found["refusals"] = refusals
# A call refused on JAX anyway (backends.require_backend) says how to
# install TensorFlow too.
try:
    multigpu.check_equivalence(reference, x, y, gpus=2, engine="strategy")
    found["strategy_engine"] = None
except multigpu.backends.UnsupportedBackendError as error:
    found["strategy_engine"] = str(error)
try:
    raise ValueError("not a strategy's error")
except multigpu.StrategyUsageError:
    found["except"] = "caught"
except ValueError:
    found["except"] = "passed through"

found["tensorflow"] = sorted(name for name, module in sys.modules.items()
                             if name.split(".")[0] == "tensorflow"
                             and module is not None)
print("FOUND " + json.dumps(found))
'''


def test_multi_gpu_model_trains_predicts_saves_and_resumes_without_tensorflow():
    # model_parallel too: one device's numbers, saved as a plain model.
    done = subprocess.run(
        fresh_python(_CHILD), env=dict(os.environ, KERAS_BACKEND="jax"),
        capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines()
             if line.startswith("FOUND ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    found = json.loads(lines[-1][len("FOUND "):])

    assert found["engine"] == "jax"
    # The template's numbers: one device's, on all three kinds of data.
    assert found["weights"] <= 1e-5
    assert found["predict"] <= 1e-5
    assert found["loaded"] <= 1e-5 and found["load_weights"] <= 1e-5
    # The guard stops on the second batch (rows 8-15), before any write:
    # the weights are one device's after the first batch.
    assert found["guard"] == [0, 1] and found["guard_weights"] <= 1e-5
    assert found["restored"] <= 1e-6
    assert found["model_parallel"] <= 1e-5

    for name, (module, message) in found["refusals"].items():
        assert module == "tensorflow", name
        assert f"multigpu.{name}" in message
        assert 'pip install "multigpu[cpu]"' in message
        assert 'pip install "multigpu[gpu]"' in message
        assert "KERAS_BACKEND=tensorflow" in message
    assert found["except"] == "passed through"
    assert "engine='strategy'" in found["strategy_engine"]
    assert 'pip install "multigpu[cpu]"' in found["strategy_engine"]
    assert found["tensorflow"] == []
