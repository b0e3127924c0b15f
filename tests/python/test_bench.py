"""The benchmark harness runs and writes its outputs (never how fast)."""

import csv
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
if str(REPO) not in sys.path:  # `bench` lives at the top of the checkout
    sys.path.insert(0, str(REPO))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One tiny `--quick` run: plain Keras and the default engine, 2 devices."""
    output = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--workloads", "demo",
         "--devices", "2", "--configs", "plain,default", "--rounds", "1",
         "--output", str(output)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return output


def test_writes_csv_with_the_expected_columns(quick_run):
    from bench import report

    with open(quick_run / "results.csv") as stream:
        reader = csv.DictReader(stream)
        rows = list(reader)
    assert reader.fieldnames == report.COLUMNS + report.METADATA_COLUMNS
    assert {r["config"] for r in rows} >= {"plain"}
    assert any(r["is_default"] == "True" for r in rows)
    for row in rows:
        assert row["status"] == "ok"
        assert row["devices"] == "2"
        assert float(row["train_samples_per_s"]) > 0
        assert float(row["predict_samples_per_s"]) > 0
        assert float(row["peak_rss_mib"]) > 0
        assert row["tensorflow"] and row["cpu_cores"]


def test_writes_raw_measurements(quick_run):
    from bench import report

    with open(quick_run / "raw.csv") as stream:
        reader = csv.DictReader(stream)
        rows = list(reader)
    assert reader.fieldnames == report.RAW_COLUMNS
    assert {r["phase"] for r in rows} == {"train", "predict"}


def test_writes_markdown_and_plots(quick_run):
    markdown = (quick_run / "results.md").read_text()
    assert "| devices | configuration | train samples/s | x plain |" in markdown
    assert "## Environment" in markdown and "## Targets" in markdown
    for name in ("train.png", "predict.png"):
        assert (quick_run / name).read_bytes()[:8] == PNG_MAGIC
        assert f"]({name})" in markdown
