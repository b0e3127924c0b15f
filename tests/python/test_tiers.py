"""The gate's sample of the zoos, and its cover of every case and engine.

`support/tiers.py` draws the gate's sample; here the whole suite is
collected in both pytest processes (TensorFlow and JAX, as `make test`
runs them) and every zoo's sample is held to its product: each case and each
value of each axis that the full tier runs, the gate runs at least once. A
case or an engine added where the gate never reaches it (marked `full` by
hand, or an engine of the package that no zoo runs) fails here.
"""

import json
import os
import subprocess
import sys

import pytest

from multigpu.engines import choice
from support import tiers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Engines of the package the TensorFlow zoos must run in the gate, beside
# multi_gpu_model's own: the strategy engine and model_parallel.
TENSORFLOW_ENGINES = (*choice.BACKEND_ENGINES["tensorflow"], "strategy",
                      "model_parallel")


def _items(cases, engines):
    return [{"name": c, "engine": e} for c in cases for e in engines]


def test_every_case_runs_once_and_the_engines_take_turns():
    items = _items("abcdef", ("x", "y"))
    chosen = [items[p] for p in tiers.gate_sample(items, ("engine",))]
    assert [c["name"] for c in chosen] == list("abcdef")
    assert [c["engine"] for c in chosen] == ["x", "y"] * 3


def test_fewer_cases_than_engines_still_reach_every_engine():
    items = _items("a", ("x", "y", "z"))
    chosen = [items[p] for p in tiers.gate_sample(items, ("engine",))]
    assert {c["engine"] for c in chosen} == {"x", "y", "z"}


def test_two_axes_walk_their_product():
    items = [{"name": n, "engine": e, "devices": d}
             for n in "abcdefghij" for e in "wxyz" for d in (2, 3, 4)]
    chosen = [items[p] for p in tiers.gate_sample(items, ("engine", "devices"))]
    assert len(chosen) == 10  # one item a case reaches every value here
    assert {c["engine"] for c in chosen} == set("wxyz")
    assert {c["devices"] for c in chosen} == {2, 3, 4}


def test_a_turned_rotation_is_another_sample_of_the_same_cover():
    items = _items("abcd", ("x", "y"))
    plain = tiers.gate_sample(items, ("engine",))
    turned = tiers.gate_sample(items, ("engine",), turn=1)
    assert plain != turned
    assert len(plain) == len(turned) == 4


def test_a_tier_that_does_not_exist_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv(tiers.TIER_VARIABLE, "fast")
    with pytest.raises(ValueError, match="MULTIGPU_TEST_TIER='fast'.*'gate'.*'full'"):
        tiers.tier()
    monkeypatch.setenv(tiers.ROTATION_VARIABLE, "one")
    with pytest.raises(ValueError, match="MULTIGPU_TEST_ROTATION='one'"):
        tiers.rotation()


def _collected_zoos(tmp_path, backend, paths):
    report = tmp_path / f"zoos-{backend}.json"
    env = dict(os.environ, KERAS_BACKEND=backend,
               **{tiers.REPORT_VARIABLE: str(report), tiers.TIER_VARIABLE: "gate"})
    env.pop(tiers.ROTATION_VARIABLE, None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "",
         "-p", "no:cacheprovider", *paths],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def zoos(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tiers")
    tensorflow = _collected_zoos(tmp_path, "tensorflow", [
        "tests/python", "--ignore=tests/python/engines/jax"])
    jax = _collected_zoos(tmp_path, "jax", ["tests/python/engines/jax"])
    return {"tensorflow": tensorflow, "jax": jax}


def _values(items, key):
    return {json.dumps(i.get(key)) for i in items}


def test_the_gate_reaches_every_case_and_axis_value_of_every_zoo(zoos):
    unreached = []
    for backend, found in zoos.items():
        for zoo, product in found.items():
            items = product["items"]
            gate = [items[p] for p in product["gate"]]
            for axis in product["axes"]:
                for value in _values(items, axis) - _values(gate, axis):
                    unreached.append(f"{zoo} ({backend}): {axis}={value}")
            def case(item, axes=product["axes"]):
                return json.dumps({k: v for k, v in item.items() if k not in axes},
                                  sort_keys=True)
            for value in {case(i) for i in items} - {case(i) for i in gate}:
                unreached.append(f"{zoo} ({backend}): case {value}")
    assert not unreached, "the gate never runs:\n" + "\n".join(sorted(unreached))


def test_the_zoos_are_sampled_not_run_whole(zoos):
    # Where a zoo has at least as many cases on engines as engines, the gate
    # runs part of them, or the marker does nothing.
    whole = []
    for zoo, product in zoos["tensorflow"].items():
        on_engines = [i for i in product["items"] if "engine" in i]
        gate = [product["items"][p] for p in product["gate"]]
        cases = {json.dumps({k: v for k, v in i.items() if k != "engine"},
                            sort_keys=True) for i in on_engines}
        if (len(cases) >= len(_values(on_engines, "engine")) > 1
                and len([i for i in gate if "engine" in i]) == len(on_engines)):
            whole.append(zoo)
    assert not whole


def test_every_engine_of_the_package_runs_in_a_zoo_of_the_gate(zoos):
    reached = set()
    for product in zoos["tensorflow"].values():
        for position in product["gate"]:
            engine = product["items"][position].get("engine")
            if engine is not None:
                reached.add(engine)
    missing = [e for e in TENSORFLOW_ENGINES
               if not any(r == e or r.startswith(f"{e}_") for r in reached)]
    assert not missing, f"no zoo of the gate runs the engines {missing}"
    # The JAX engine's zoos are the JAX process's: some must be there.
    assert zoos["jax"], "no zoo in tests/python/engines/jax"
    assert choice.BACKEND_ENGINES["jax"] == ("jax",), (
        "a second JAX engine: give the JAX zoos an engine axis")
