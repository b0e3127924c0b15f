"""The processes the suite starts begin as in an environment with the core only.

`workers/_common.py` hides the packages `.venv` holds for other steps
(scikit-learn, SciPy, JAX, pandas) before TensorFlow starts, and leaves a
process that has Keras loaded as it is.
"""

import importlib
import json
import subprocess

from support.worker_scripts import common_module, fresh_python


def test_a_fresh_process_trains_without_the_optional_packages():
    code = (
        "import json, sys\n"
        "import multigpu, keras\n"
        "model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
        "model.compile(optimizer='sgd', loss='mse')\n"
        "model.fit(keras.ops.ones((4, 2)), keras.ops.ones((4, 1)), verbose=0)\n"
        "print(json.dumps({name: sys.modules.get(name) is not None\n"
        "                  for name in ('tensorflow', *_common.OPTIONAL_PACKAGES)}))\n"
    )
    result = subprocess.run(fresh_python(code), capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert loaded == {"tensorflow": True, "jax": False, "pandas": False,
                      "scipy": False, "sklearn": False}


def test_a_process_with_keras_loaded_keeps_its_packages():
    assert common_module().hide_optional_packages() == ()
    assert importlib.import_module("sklearn").__name__ == "sklearn"
