"""The package's import graph: no cycles, no private names across modules.

Read from the source (the AST), imports inside functions included: a
module that imports another lazily to dodge a cycle still depends on it.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "multigpu"


# Every module of the package, subpackages (`multigpu.checkpoints`) included.
MODULE_FILES = sorted(PACKAGE.rglob("*.py"))


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path):
    """The package a relative import in `path` starts from."""
    name = _module_name(path)
    return name if path.stem == "__init__" else name.rpartition(".")[0]


def _imports(path):
    """`(module, names)` for every `multigpu` import in the file."""
    modules = {_module_name(p) for p in MODULE_FILES}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names
                      if alias.name.split(".")[0] == "multigpu"]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from . import x, from .x import y
                base = _package_of(path).split(".")
                base = ".".join(base[:len(base) - node.level + 1])
                module = base + (f".{module}" if module else "")
            if module.split(".")[0] != "multigpu":
                continue
            names = [alias.name for alias in node.names]
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            found += [(m, []) for m in submodules]
            rest = [n for n in names if f"{module}.{n}" not in modules]
            if rest or not submodules:
                found.append((module, rest))
    return found


def import_graph():
    """`{module: {modules it imports}}` over `python/multigpu`."""
    return {
        _module_name(path): {module for module, _ in _imports(path)}
        - {_module_name(path)}
        for path in MODULE_FILES
    }


def find_cycle(graph):
    """One import cycle as a list of modules (first repeated last), or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                cycle = visit(target, stack)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def test_find_cycle_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_import_graph_has_no_cycle():
    graph = import_graph()
    assert "multigpu.engines.tensorflow.replicate" in graph and graph["multigpu.engines.front"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("path", MODULE_FILES, ids=_module_name)
def test_no_module_imports_a_private_name_of_another(path):
    private = [f"{module}.{name}" for module, names in _imports(path)
               for name in names if name.startswith("_")]
    assert not private


def _private_attributes_by_name(path):
    """`getattr(x, "_name")`-style reads of private attributes in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")
                and not str(node.args[1].value).startswith("__")):
            found.append(f"{path.name}:{node.lineno} {node.args[1].value}")
    return found


@pytest.mark.parametrize(
    "path", [p for p in MODULE_FILES if p.name != "internals.py"],
    ids=_module_name)
def test_only_internals_reads_private_attributes_by_name(path):
    # ruff's SLF001 catches `x._name`; this catches getattr(x, "_name").
    assert not _private_attributes_by_name(path)


# The packages from the floor up: a module may import its own package and
# the packages below it, never one above. The shared modules at the top of
# `multigpu` (messages, arguments, internals, devices, variables, saving)
# are the floor; the entry points (`multigpu` itself, `launch`, `demo`)
# stand above everything.
PACKAGE_ORDER = ["floor", "cluster", "step", "checkpoints", "distribute",
                 "engines", "partition", "placement", "insight", "entry"]
ENTRY_MODULES = {"multigpu", "multigpu.launch", "multigpu.demo"}


def package_floor(module):
    """The index in `PACKAGE_ORDER` of the package `module` belongs to."""
    if module in ENTRY_MODULES:
        return PACKAGE_ORDER.index("entry")
    parts = module.split(".")
    if len(parts) > 2 or f"multigpu.{parts[1]}" in PACKAGES:
        return PACKAGE_ORDER.index(parts[1])
    return PACKAGE_ORDER.index("floor")


PACKAGES = {_module_name(p) for p in MODULE_FILES if p.name == "__init__.py"} - {"multigpu"}


def test_every_package_has_a_place_in_the_order():
    assert {p.split(".")[1] for p in PACKAGES} <= set(PACKAGE_ORDER)


def test_packages_import_only_their_own_and_those_below():
    upward = [f"{module} -> {target}"
              for module, targets in import_graph().items()
              for target in targets
              if package_floor(target) > package_floor(module)]
    assert not upward


def test_package_floor_places_modules():
    assert package_floor("multigpu.messages") == 0
    assert package_floor("multigpu.engines.tensorflow.mirrored") == PACKAGE_ORDER.index("engines")
    assert package_floor("multigpu.insight") == PACKAGE_ORDER.index("insight")
    assert package_floor("multigpu.launch") == len(PACKAGE_ORDER) - 1


def test_at_most_twelve_modules_at_the_top_in_five_or_more_packages():
    top = [p for p in PACKAGE.glob("*.py")]
    assert len(top) <= 12, sorted(p.name for p in top)
    assert len({p.split(".")[1] for p in PACKAGES}) >= 5
