"""The suite's two tiers: the gate (`make test`) and the full run (`make test-full`).

`MULTIGPU_TEST_TIER` names the tier: `gate` (the default) or `full`. The
full tier runs every test. The gate leaves out two kinds of test, each
named by a marker:

* `full`: a test whose point is depth (a soak, every SIGKILL point, every
  Slurm case) runs in the full tier only;
* `zoo(axes=(...))`: a parametrized product of cases and axes (engines,
  device counts, batch shapes) runs, in the gate, the sample `gate_sample`
  picks: every case at least once, every value of every axis at least once,
  by a rotation along the product, not by a hand-picked list.
  `MULTIGPU_TEST_ROTATION=N` turns the rotation by N, to run another sample
  of the same size; the header of a run prints the tier and the rotation,
  so a failed sample can be run again as it was.

`MULTIGPU_TIER_REPORT=FILE` writes, for every zoo, its items and the gate's
sample to FILE (JSON); `tests/python/test_tiers.py` reads it to check the
cover.

Example:
    MULTIGPU_TEST_TIER=full pytest tests/python/engines/test_layer_zoo.py
    pytest 'tests/python/engines/test_layer_zoo.py::test_x[lstm-mirrored]'
"""

import json
import os

import pytest

TIER_VARIABLE = "MULTIGPU_TEST_TIER"
ROTATION_VARIABLE = "MULTIGPU_TEST_ROTATION"
REPORT_VARIABLE = "MULTIGPU_TIER_REPORT"
TIERS = ("gate", "full")
DEFAULT_AXES = ("engine",)


def tier():
    """The tier this run is, from `MULTIGPU_TEST_TIER` (default `gate`).

    Returns:
        `"gate"` or `"full"`.

    Raises:
        ValueError: the variable holds another value.
    """
    value = os.environ.get(TIER_VARIABLE, "gate") or "gate"
    if value not in TIERS:
        raise ValueError(
            f"{TIER_VARIABLE}={value!r} is not a tier: use 'gate' (make test) "
            f"or 'full' (make test-full)")
    return value


def rotation():
    """How far the gate's rotation is turned, from `MULTIGPU_TEST_ROTATION`.

    Raises:
        ValueError: the variable is not a whole number.
    """
    value = os.environ.get(ROTATION_VARIABLE, "0") or "0"
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"{ROTATION_VARIABLE}={value!r} is not a whole number: unset it "
            f"for the gate's own sample, or give one such as 1") from None


def gate_sample(items, axes, turn=0):
    """The positions of `items` that the gate runs.

    Items with the same values outside `axes` are one case. Case number i
    (in the items' order) runs its item number `(i + turn) % k` of its k
    items, which walks the axes' product along the cases; then every value
    of an axis that no chosen item has yet is given its first item, so that
    no value goes untried however few the cases are.

    Args:
        items: One dict per item, parameter name to value id, in order.
        axes: The parameter names that are axes; the others make the case.
        turn: Turns the rotation: another sample of the same cover.

    Returns:
        A sorted list of positions in `items`.

    Example:
    >>> items = [{"name": n, "engine": e} for n in "abc" for e in "xy"]
    >>> gate_sample(items, ("engine",))
    [0, 3, 4]
    """
    cases = {}
    for position, params in enumerate(items):
        case = tuple((k, v) for k, v in sorted(params.items())
                     if k not in axes)
        cases.setdefault(case, []).append(position)
    chosen = {members[(i + turn) % len(members)]
              for i, members in enumerate(cases.values())}
    for axis in axes:
        reached = {items[p].get(axis) for p in chosen}
        for position, params in enumerate(items):
            if params.get(axis) not in reached:
                chosen.add(position)
                reached.add(params.get(axis))
    return sorted(chosen)


def _param_ids(item):
    """Parameter name to the id of its value, for a parametrized item."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return {}
    return {name: _value_id(value) for name, value in callspec.params.items()}


def _value_id(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return str(value)
    return repr(value)


def _zoo_groups(items):
    """Zoo items by the product they belong to, with that product's axes.

    A zoo is one test function, or with `zoo(scope="module")` every test
    of its module (the function's name is then part of the case, so the
    rotation runs along the module's tests). Items that carry `slow` of
    their own are outside both tiers and left out.
    """
    groups = {}
    for item in items:
        marker = item.get_closest_marker("zoo")
        if marker is None or item.get_closest_marker("slow"):
            continue
        function = item.nodeid.split("[", 1)[0]
        params = _param_ids(item)
        if marker.kwargs.get("scope", "function") == "module":
            key = function.split("::", 1)[0]
            params["test"] = function.split("::", 1)[1]
        else:
            key = function
        axes = tuple(marker.kwargs.get("axes", DEFAULT_AXES))
        groups.setdefault(key, (axes, []))[1].append((item, params))
    return groups


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "full: runs in the full tier only (make test-full, "
        "MULTIGPU_TEST_TIER=full): depth the gate samples elsewhere")
    config.addinivalue_line(
        "markers", "zoo(axes=('engine',)): a product of cases and axes; the "
        "gate runs a rotation that reaches every case and every axis value "
        "(tests/python/support/tiers.py)")
    tier()
    rotation()


def pytest_report_header(config):
    del config  # pytest passes it by name
    return (f"tier: {tier()} ({TIER_VARIABLE}); zoo rotation: {rotation()} "
            f"({ROTATION_VARIABLE})")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks the zoo items outside the gate's sample `full`; in the gate,
    deselects every item marked `full`.

    It runs before `-m` deselects, so that the sample is the same whatever
    `-m` leaves (the gate's `-m` and the cover test's collection agree).
    """
    report = {}
    for zoo, (axes, members) in _zoo_groups(items).items():
        # Items marked `full` by hand are never the gate's: the sample is
        # drawn from the others, and the cover test fails if that leaves a
        # case or an axis value out of the gate.
        candidates = [i for i, (item, _) in enumerate(members)
                      if not item.get_closest_marker("full")]
        drawn = gate_sample([members[i][1] for i in candidates], axes,
                            rotation())
        gate = {candidates[i] for i in drawn}
        for position, (item, _) in enumerate(members):
            if position not in gate:
                item.add_marker(pytest.mark.full)
        report[zoo] = {"axes": list(axes),
                       "items": [params for _, params in members],
                       "gate": sorted(gate)}
    path = os.environ.get(REPORT_VARIABLE)
    if path:
        with open(path, "w") as file:
            json.dump(report, file, indent=1, sort_keys=True)
    if tier() == "full":
        return
    kept, left = [], []
    for item in items:
        (left if item.get_closest_marker("full") else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
