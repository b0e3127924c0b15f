"""`python -m bench.gpu_check --small` runs on CPU devices, so it cannot rot.

On this machine (no GPU) every row either passes or is skipped for a
capability only a GPU has; none differs. What a GPU's run measures is its
own: docs/benchmarks.md, "GPU check".
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `bench` lives at the top of the checkout
    sys.path.insert(0, str(REPO))

BACKENDS = ("jax", "tensorflow")


def _small_run(backend, out):
    """The check's `--small` run on `backend`, in a process of its own.

    Keras picks its backend once per process, at import; the run makes its
    own 2 logical CPU devices.
    """
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--small", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


# The full tier runs the check on both backends (30 s to a minute each):
# what it calls (memory_plan, find_batch_size, the engines) the gate tests
# directly, and bench-quick runs a benchmark harness.
@pytest.mark.full
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_row_passes_or_names_the_missing_gpu(backend, tmp_path):
    if backend == "jax" and importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed in this Python")
    from bench import gpu_check

    result = _small_run(backend, tmp_path / "gpu-check.json")
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == list(gpu_check.ROWS)
    for name, row in rows.items():
        assert row["status"] in ("ok", "skipped"), (name, row)
        if row["status"] == "skipped":
            assert row["reason"].startswith("no GPU: "), (name, row)
        assert row["seconds"] >= 0 and row["device"].startswith("2 x "), row
    # Without GPU, gpus=None takes the logical CPU devices.
    assert rows["device_discovery"]["found"] == [
        "/device:CPU:0", "/device:CPU:1"]
    assert rows["device_discovery"]["replicas"] == 2
    assert any(w.startswith("No GPU found")
               for w in rows["device_discovery"]["warnings"])
    # The rows that compare numbers say with what tolerance, from where.
    for name in ("engine_vs_keras_fit", "mixed_bfloat16", "mixed_float16",
                 "xla"):
        row = rows[name]
        assert row["difference"] <= row["tolerance"], row
        assert "one-device runs" in row["tolerance_source"], row
    assert rows["mixed_float16"]["optimizer"] == "LossScaleOptimizer"
    # The skipped rows still ran their calls.
    assert rows["memory_plan"]["plan_bytes"] > 0
    assert rows["find_batch_size_oom"]["batch"] >= 2
    assert rows["find_batch_size_oom"]["plan_fits"] is True
    assert rows["scaling"]["model_efficiency"] > 0
    # It runs on a GPU image without TensorFlow: on JAX it imports none.
    assert result["tensorflow_imported"] is (backend == "tensorflow")
