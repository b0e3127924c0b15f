"""The offline bundle for a GPU node with JAX (.ci/gpu-bundle.py) installs
with no package index and trains (docs/cluster.md, "An offline GPU node").

The bundle is built for this Python, so that it can be installed here, in
an empty virtual environment (no system site-packages) that first gets only
what stands for the GPU image: jax, jaxlib, NumPy and what they require, at
this environment's versions. Then `pip install --no-index --find-links
BUNDLE multigpu`, with no pip configuration (this machine's configures
extra indexes and find-links), must resolve, and multi_gpu_model must
train on JAX across 2 CPU devices without TensorFlow.

Building the bundle and installing the image need the package index
(`pip download`): without it the test fails, saying so, rather than
skipping: CI has the index, and a skip would hide a broken bundle.
"""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "gpu-bundle.py"
LIMIT_MIB = 32
# The GPU image's Python packages (the CUDA plugins aside): JAX and what
# jax and jaxlib require.
IMAGE = ("jax", "jaxlib", "numpy", "ml-dtypes", "opt-einsum", "scipy")
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"

_TRAIN = r'''
import importlib.util, sys
# The node has no TensorFlow: the image does not, and the bundle must not
# bring it.
assert importlib.util.find_spec("tensorflow") is None
import multigpu
assert multigpu.__file__.startswith(sys.prefix), multigpu.__file__
multigpu.virtual_devices(2)
import jax, keras, numpy as np
assert len(jax.devices()) == 2, jax.devices()
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1)])
parallel = multigpu.multi_gpu_model(model, gpus=2)
parallel.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
x = np.random.default_rng(0).standard_normal((48, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
losses = parallel.fit(x, y, batch_size=12, epochs=4, verbose=0).history["loss"]
assert losses[-1] < losses[0], losses
print("trained", keras.__version__, jax.__version__, losses)
'''


def _normalized(name):
    """A distribution's name as PEP 503 compares names."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(command, what, env=None):
    """Runs `command`; fails the test with its output, saying what it was."""
    result = subprocess.run(command, capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, (
        f"{what} failed (exit {result.returncode}): {' '.join(map(str, command))}\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result.stdout


def _online(command, what):
    """Runs a step that downloads; its failure names the index it needs."""
    return _run(command, f"{what} (needs the package index, PyPI, through "
                         "pip download: this test fails without it)")


def _offline_environment():
    """The environment of the node's install and training: no pip
    configuration (no index, find-links or constraints from this machine),
    no device count inherited from the suite (XLA_FLAGS), Keras on JAX."""
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("PIP_", "XLA_", "KERAS_"))
                   and name not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return dict(environment, PIP_CONFIG_FILE=os.devnull, KERAS_BACKEND="jax",
                PYTHONNOUSERSITE="1")


def _bundle(out):
    """Builds the bundle for this Python into `out`; returns the script's
    listing."""
    return _online([sys.executable, str(SCRIPT), "--python-version",
                    PYTHON_VERSION, "--out", str(out)], "building the bundle")


def _image(venv):
    """An empty venv holding only the GPU image's stand-in: jax, jaxlib,
    NumPy and their requirements, as this environment has them.

    Without pip in it (the host's pip installs into it with --python), and
    without byte-compiling: both cost seconds the check does not need.
    """
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], "python -m venv")
    python = venv / "bin" / "python"
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in IMAGE]
    _online([sys.executable, "-m", "pip", "--python", str(python), "install",
             "--quiet", "--no-deps", "--no-compile", "--only-binary=:all:", *pins],
            "installing the GPU image's stand-in")
    return python


# Builds a bundle and installs it with pip, about a minute on 2 cores: the
# full tier's.
@pytest.mark.full
def test_the_offline_bundle_installs_beside_jax_and_trains(tmp_path):
    bundle = tmp_path / "bundle"
    listing = _bundle(bundle)
    wheels = {_normalized(path.name.split("-")[0]): path.name.split("-")[1]
              for path in bundle.glob("*.whl")}
    names = set(wheels)
    assert "multigpu" in names and "keras" in names, listing
    assert not names & set(IMAGE), f"the image's packages are in the bundle:\n{listing}"
    assert not [n for n in names if n.startswith("tensorflow")], listing
    size = sum(path.stat().st_size for path in bundle.iterdir()) / 2**20
    assert size <= LIMIT_MIB, f"{size:.2f} MiB, over {LIMIT_MIB} MiB:\n{listing}"
    assert f"{size:8.2f} MiB  in all" in listing, listing
    # requirements.txt pins every wheel of the bundle, and nothing else.
    pins = [line for line in (bundle / "requirements.txt").read_text().splitlines()
            if not line.startswith("#")]
    assert sorted(pins) == sorted(f"{n}=={v}" for n, v in wheels.items()), pins

    python = _image(tmp_path / "node")
    offline = _offline_environment()
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "--quiet", "--no-compile", "--no-index", "--find-links",
          str(bundle), "multigpu"], "the offline install", env=offline)
    # Every requirement of what is installed is met: the image's versions
    # with the bundle's.
    _run([*pip, "check"], "pip check", env=offline)
    trained = _run([str(python), "-c", _TRAIN], "training on the node", env=offline)
    assert "trained" in trained, trained
