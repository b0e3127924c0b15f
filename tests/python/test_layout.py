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
# The two modules that touch Keras's and TensorFlow's private attributes.
INTERNALS = ("internals.py", "tensorflow_internals.py")


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
    "path", [p for p in MODULE_FILES if p.name not in INTERNALS],
    ids=_module_name)
def test_only_internals_reads_private_attributes_by_name(path):
    # ruff's SLF001 catches `x._name`; this catches getattr(x, "_name").
    assert not _private_attributes_by_name(path)


# The packages from the floor up: a module may import its own package and
# the packages below it, never one above. The shared modules at the top of
# `multigpu` (messages, arguments, internals, devices, variables, saving),
# the data checks (`multigpu.inputs`) and the runtime of each backend
# (`multigpu.runtime`) are the floor; the entry points (`multigpu` itself,
# `launch`, `demo`) stand above everything.
PACKAGE_ORDER = ["floor", "cluster", "step", "checkpoints", "distribute",
                 "engines", "partition", "placement", "insight", "entry"]
ENTRY_MODULES = {"multigpu", "multigpu.launch", "multigpu.demo"}
FLOOR_PACKAGES = {"runtime", "inputs"}


def package_floor(module):
    """The index in `PACKAGE_ORDER` of the package `module` belongs to."""
    if module in ENTRY_MODULES:
        return PACKAGE_ORDER.index("entry")
    parts = module.split(".")
    if parts[1] in FLOOR_PACKAGES:
        return PACKAGE_ORDER.index("floor")
    if len(parts) > 2 or f"multigpu.{parts[1]}" in PACKAGES:
        return PACKAGE_ORDER.index(parts[1])
    return PACKAGE_ORDER.index("floor")


PACKAGES = {_module_name(p) for p in MODULE_FILES if p.name == "__init__.py"} - {"multigpu"}


def test_every_package_has_a_place_in_the_order():
    assert {p.split(".")[1] for p in PACKAGES} <= set(PACKAGE_ORDER) | FLOOR_PACKAGES


def test_packages_import_only_their_own_and_those_below():
    upward = [f"{module} -> {target}"
              for module, targets in import_graph().items()
              for target in targets
              if package_floor(target) > package_floor(module)]
    assert not upward


def test_package_floor_places_modules():
    assert package_floor("multigpu.messages") == 0
    assert package_floor("multigpu.runtime.jax") == 0
    assert package_floor("multigpu.engines.tensorflow.mirrored") == PACKAGE_ORDER.index("engines")
    assert package_floor("multigpu.insight") == PACKAGE_ORDER.index("insight")
    assert package_floor("multigpu.launch") == len(PACKAGE_ORDER) - 1


def test_at_most_twelve_modules_at_the_top_in_five_or_more_packages():
    top = [p for p in PACKAGE.glob("*.py")]
    assert len(top) <= 12, sorted(p.name for p in top)
    assert len({p.split(".")[1] for p in PACKAGES}) >= 5


# Keras's and TensorFlow's private modules (`keras.src...`; below the
# `tensorflow` package, whose public API is `tf.*`) are imported by
# `multigpu.internals` only.
IMPORT_FUNCTIONS = ("import_module", "__import__", "find_spec")


def _is_private_module(name):
    return (name == "keras.src" or name.startswith("keras.src.")
            or name.startswith("tensorflow."))


def private_imports(source):
    """Imports of Keras's or TensorFlow's private modules in `source`.

    `import tensorflow.python.x`, `from keras.src import y`, `from
    tensorflow import python`, and `importlib.import_module("keras.src.z")`
    (or `__import__`, `find_spec`) with a literal name.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call):
            function = node.func
            called = (function.attr if isinstance(function, ast.Attribute)
                      else getattr(function, "id", None))
            if (called in IMPORT_FUNCTIONS and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                names = [node.args[0].value]
        found += [f"{node.lineno}: {name}" for name in names
                  if _is_private_module(name)]
    return found


def test_private_imports_finds_every_form():
    source = "\n".join([
        "import keras", "import tensorflow as tf", "from keras import ops",
        "import tensorflow.python.eager.context",
        "from tensorflow.python.framework import ops",
        "from keras.src.utils import tracking",
        "from tensorflow import python",
        "from keras import src",
        "import importlib",
        "importlib.import_module('keras.src.saving')",
        "__import__('tensorflow.tsl.profiler')",
        "from multigpu import internals",
    ])
    assert private_imports(source) == [
        "4: tensorflow.python.eager.context",
        "5: tensorflow.python.framework", "5: tensorflow.python.framework.ops",
        "6: keras.src.utils", "6: keras.src.utils.tracking",
        "7: tensorflow.python", "8: keras.src",
        "10: keras.src.saving", "11: tensorflow.tsl.profiler",
    ]


@pytest.mark.parametrize(
    "path", [p for p in MODULE_FILES if p.name not in INTERNALS],
    ids=_module_name)
def test_only_internals_imports_keras_and_tensorflow_privates(path):
    found = private_imports(path.read_text())
    assert not found


def _ruff_lint():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    pyproject = PACKAGE.parents[1] / "pyproject.toml"
    return tomllib.loads(pyproject.read_text())["tool"]["ruff"]["lint"]


def test_ruff_refuses_private_attributes_outside_internals():
    lint = _ruff_lint()
    assert "SLF001" in lint["select"]
    package_ignores = {pattern: rules for pattern, rules
                       in lint["per-file-ignores"].items()
                       if pattern.startswith("python/")}
    assert package_ignores == {f"python/multigpu/{name}": ["SLF001"]
                               for name in INTERNALS}
    silenced = [f"{path.relative_to(PACKAGE)}:{number}"
                for path in MODULE_FILES if path.name not in INTERNALS
                for number, line in enumerate(path.read_text().splitlines(), 1)
                if "noqa" in line and "SLF001" in line]
    assert not silenced


def _foreign_private_names(cls):
    """Private names of the Keras and TensorFlow classes `cls` builds on.

    Their methods and class attributes, and the attributes their code sets
    on `self`. A Keras model made from inputs and outputs becomes a
    functional model when constructed, so its functional class counts too.
    """
    import inspect
    import re

    import keras

    bases = [base for base in cls.__mro__
             if not base.__module__.startswith("multigpu")
             and base is not object]
    if issubclass(cls, keras.Model):
        inputs = keras.Input((1,))
        functional = type(keras.Model(inputs, inputs))
        bases += list(functional.__mro__)
    names = set()
    for base in bases:
        names |= {name for name in vars(base)
                  if name.startswith("_") and not name.startswith("__")}
        try:
            source = inspect.getsource(base)
        except (OSError, TypeError):
            continue
        names |= set(re.findall(r"self\.(_[A-Za-z]\w*)\s*=", source))
    return names


def _private_names_used(class_node):
    """Single-underscore names a class body uses on `self`, `cls`, `super()` or defines."""
    names = set()
    for node in ast.walk(class_node):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and (
                not node.attr.startswith("__")):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
                    isinstance(owner, ast.Call)
                    and getattr(owner.func, "id", None) == "super"):
                names.add(node.attr)
    for node in class_node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _classes_on_keras_or_tensorflow():
    import importlib

    found = []
    for path in MODULE_FILES:
        if path.name in INTERNALS:
            continue
        module = importlib.import_module(_module_name(path))
        for node in ast.parse(path.read_text()).body:
            cls = getattr(module, node.name, None) if isinstance(
                node, ast.ClassDef) else None
            if isinstance(cls, type) and any(
                    base.__module__.split(".")[0] in ("keras", "tensorflow")
                    for base in cls.__mro__):
                found.append((f"{_module_name(path)}.{node.name}", cls, node))
    return found


def test_classes_on_keras_or_tensorflow_touch_none_of_their_privates():
    # ruff's SLF001 catches `model._name`; this catches `self._name` and
    # `super()._name` (used, overridden or set) where Keras's or
    # TensorFlow's class has that private name.
    classes = _classes_on_keras_or_tensorflow()
    assert any(name.endswith("MirroredModel") for name, _, _ in classes)
    touched = {name: sorted(_private_names_used(node)
                            & _foreign_private_names(cls))
               for name, cls, node in classes}
    assert not {name: names for name, names in touched.items() if names}


def _imports_tensorflow(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            if any(a.name.split(".")[0] == "tensorflow" for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] == "tensorflow":
                return True
    return False


# The seam for a second Keras backend: `engines/` itself is Keras code; what
# runs TensorFlow lives in `engines/tensorflow/`.
@pytest.mark.parametrize("path", sorted((PACKAGE / "engines").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_backend_neutral_engine_modules_do_not_import_tensorflow(path):
    assert not _imports_tensorflow(path)


def _runs_on_import(path):
    """What importing the module at `path` imports: `(modules, tensorflow)`.

    Its imports at module level (in `if`, `try`, `with` and class bodies
    too), each with the packages above it, which Python imports first. An
    `if` whose condition names TensorFlow (`if backends.current() ==
    "tensorflow":`) is that backend's branch and is left out. Imports
    inside functions run when the function is called: the JAX path's calls
    run with TensorFlow unimportable in
    `engines/jax/test_jax_without_tensorflow.py`.

    Returns:
        The `multigpu` modules imported, and whether `tensorflow` (or one
        of its modules) is.
    """
    modules = {_module_name(p) for p in MODULE_FILES}
    found, tensorflow = set(), False

    def named(name):
        nonlocal tensorflow
        if name.split(".")[0] == "tensorflow":
            tensorflow = True
        elif name.split(".")[0] == "multigpu":
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))

    def visit(statements):
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    named(alias.name)
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = _package_of(path).split(".")
                    base = ".".join(base[:len(base) - node.level + 1])
                    module = base + (f".{module}" if module else "")
                named(module)
                for alias in node.names:
                    if f"{module}.{alias.name}" in modules:
                        named(f"{module}.{alias.name}")
            elif isinstance(node, ast.If) and "tensorflow" in ast.unparse(node.test):
                visit(node.orelse)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, None) or [])

    visit(ast.parse(path.read_text()).body)
    return found & modules, tensorflow


def tensorflow_paths(roots):
    """Chains of imports from `roots` to a module that imports TensorFlow.

    Args:
        roots: Module names to start from.

    Returns:
        One chain per module reached that imports `tensorflow` when
        imported, e.g. `["multigpu", "multigpu.devices"]`; empty if none.
    """
    files = {_module_name(p): p for p in MODULE_FILES}
    on_import = {name: _runs_on_import(path) for name, path in files.items()}
    parent = dict.fromkeys(roots)
    queue = list(roots)
    while queue:
        module = queue.pop(0)
        for target in sorted(on_import[module][0] - set(parent)):
            parent[target] = module
            queue.append(target)
    chains = []
    for module in sorted(parent):
        if on_import[module][1]:
            chain = [module]
            while parent[chain[-1]] is not None:
                chain.append(parent[chain[-1]])
            chains.append(chain[::-1])
    return chains


# On JAX, Keras runs without TensorFlow, and so does this package: importing
# `multigpu` (its TensorFlow branch aside) or any module of the JAX engine
# reaches no module that imports TensorFlow, however many imports away.
JAX_ROOTS = ["multigpu"] + sorted(
    _module_name(p) for p in (PACKAGE / "engines" / "jax").glob("*.py"))


def test_nothing_imported_on_jax_reaches_tensorflow():
    chains = tensorflow_paths(JAX_ROOTS)
    assert not chains, "\n".join(" -> ".join(chain) for chain in chains)


def test_tensorflow_paths_finds_a_chain_through_the_package():
    # The check above finds what exists: the TensorFlow engines reach it,
    # through a module that does not import it itself.
    chains = tensorflow_paths(["multigpu.engines.tensorflow.mirrored"])
    assert ["multigpu.engines.tensorflow.mirrored",
            "multigpu.engines.tensorflow.trainer",
            "multigpu.step.guard"] in chains
    assert "multigpu.engines.template" in _runs_on_import(
        PACKAGE / "engines" / "tensorflow" / "trainer.py")[0]


def test_the_tensorflow_engines_import_tensorflow():
    # The check above reads imports that exist: it finds the TensorFlow ones.
    assert _imports_tensorflow(PACKAGE / "engines" / "tensorflow" / "replicate.py")


# Where the code may ask which backend runs and branch on the answer: the
# backend module, the one place that picks the backend's runtime module,
# the package's front (its TensorFlow-only names; JAX's processes join at
# import, before JAX's first computation) and what only TensorFlow does.
# Everywhere else a backend's way is found by its name in a table
# (`_MODEL_MAKERS[backend]`), or asked of `multigpu.runtime`.
MAY_BRANCH_ON_THE_BACKEND = ("backends.py", "runtime/__init__.py",
                             "__init__.py", *INTERNALS)
BACKEND_QUESTIONS = ("is_jax", "is_tensorflow", "current", "backend")


def backend_branches(source):
    """Lines of `source` that test which backend runs (`if is_jax()`, ==)."""
    def asks(node):
        return (isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None))
                in BACKEND_QUESTIONS)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
                asks(side) for side in [node.left, *node.comparators]):
            found.append(node.lineno)
        elif isinstance(node, (ast.If, ast.IfExp)) and asks(node.test):
            found.append(node.lineno)
    return found


def test_backend_branches_finds_tests_and_comparisons():
    source = ("if backends.is_jax():\n    pass\n"
              "x = 1 if keras.backend.backend() == 'jax' else 2\n"
              "y = TABLE[backends.current()]\n")
    assert backend_branches(source) == [1, 3]


@pytest.mark.parametrize(
    "path",
    [p for p in MODULE_FILES
     if "engines/tensorflow" not in p.as_posix()
     and p.relative_to(PACKAGE).as_posix() not in MAY_BRANCH_ON_THE_BACKEND],
    ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_module_branches_on_the_backend(path):
    assert backend_branches(path.read_text()) == []


@pytest.mark.parametrize("path", MODULE_FILES,
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_module_is_over_600_lines(path):
    # One concept a module: past 600 lines a module has held two so far.
    assert len(path.read_text().splitlines()) <= 600
