"""One owner for each decision: what one module makes, no other makes its way.

Read from the source (the AST) of `python/multigpu`: a call that makes one
of these things appears only in the module that owns it, so a second way
of making it cannot grow back unseen.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "multigpu"


def _calls(tree):
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _name(function):
    """The called name: `f` of `f(...)` and of `x.f(...)`."""
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else None


def _fresh_optimizers(tree):
    """Optimizers made anew from another's config.

    `type(optimizer).from_config(...)`, `optimizer.__class__.from_config(...)`
    (any `from_config` of something named like an optimizer), and Keras's
    `keras.optimizers.serialize` (`deserialize(serialize(optimizer))`).
    """
    found = []
    for call in _calls(tree):
        function = call.func
        if not isinstance(function, ast.Attribute):
            continue
        receiver = ast.unparse(function.value)
        if function.attr == "from_config" and "optim" in receiver.lower():
            found.append(ast.unparse(call))
        elif function.attr == "serialize" and receiver.endswith("optimizers"):
            found.append(ast.unparse(call))
    return found


def _signature_bindings(tree):
    """Signatures of Keras's methods (`fit`'s, `compile`'s, ...), or bound.

    One per `signature(...)` call that reads a `keras.Model` method or whose
    result is bound (`.bind(...)`).
    """
    bound = {id(call.func.value) for call in _calls(tree)
             if _name(call.func) in ("bind", "bind_partial")
             and isinstance(call.func.value, ast.Call)}
    return [ast.unparse(call) for call in _calls(tree)
            if _name(call.func) == "signature"
            and (id(call) in bound or "Model" in ast.unparse(call))]


def _compile_configs(tree):
    """Reads of a model's compile config, to compile another model alike."""
    return [ast.unparse(call) for call in _calls(tree)
            if _name(call.func) == "get_compile_config"]


def _copies_in_a_scope(tree):
    """`copy_model` called inside a `with ....scope()` block."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.With) or not any(
                isinstance(item.context_expr, ast.Call)
                and _name(item.context_expr.func) == "scope"
                for item in node.items):
            continue
        for child in node.body:
            found += [ast.unparse(call) for call in _calls(child)
                      if _name(call.func) == "copy_model"]
    return found


def _engine_choices(tree):
    """Engine choices made: `EngineChoice(...)` and `choose_engine(...)`."""
    return [ast.unparse(call) for call in _calls(tree)
            if _name(call.func) in ("EngineChoice", "choose_engine")]


def _backend_refusals(tree):
    """Errors saying a call needs another Keras backend."""
    return [ast.unparse(call) for call in _calls(tree)
            if _name(call.func) == "UnsupportedBackendError"]


# What is made -> (how it is found, its owners: paths under python/multigpu).
OWNERS = {
    "a fresh optimizer": (_fresh_optimizers, {"engines/compiled.py"}),
    "bound arguments of a keras.Model method": (
        _signature_bindings, {"inputs/calls.py"}),
    "compile arguments of a compiled model": (
        _compile_configs, {"engines/compiled.py"}),
    "a copy of a model under a strategy": (
        _copies_in_a_scope, {"engines/copies.py"}),
    "the engine of multi_gpu_model": (
        _engine_choices, {"engines/choice.py"}),
    # `check_supported` and `require_backend`: every refusal of a backend.
    "an error naming the Keras backend a call needs": (
        _backend_refusals, {"backends.py"}),
}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


@pytest.mark.parametrize("what", sorted(OWNERS))
def test_only_the_owner_makes_it(what):
    find, owners = OWNERS[what]
    found = {path: calls for path, tree in _sources()
             if (calls := find(tree))}
    assert set(found) - owners == set(), (
        f"{what} is made outside {sorted(owners)}: {found}")
    # Each finder sees its owner's own way of making it.
    assert set(found) == owners


def test_the_finders_see_each_way_of_making_it():
    source = ast.parse("\n".join([
        "fresh = type(optimizer).from_config(optimizer.get_config())",
        "fresh = self.optimizer.__class__.from_config(config)",
        "fresh = keras.optimizers.deserialize(keras.optimizers.serialize(o))",
        "bound = inspect.signature(keras.Model.fit).bind(model, *args)",
        "bound = signature(getattr(keras.Model, method)).bind(model)",
        "config = template.get_compile_config()",
        "with strategy.scope(), built_like(model):",
        "    replica = copy_model(model)",
        "choice = choice_lib.EngineChoice('mirrored', 'why')",
        "raise backends.UnsupportedBackendError('needs tensorflow')",
    ]))
    assert len(_fresh_optimizers(source)) == 3
    assert len(_signature_bindings(source)) == 2
    assert len(_compile_configs(source)) == 1
    assert _copies_in_a_scope(source) == ["copy_model(model)"]
    assert len(_engine_choices(source)) == 1
    assert len(_backend_refusals(source)) == 1
    # A layer's copy from its config is not an optimizer's.
    assert not _fresh_optimizers(ast.parse(
        "clone = layer.__class__.from_config(layer.get_config())"))
