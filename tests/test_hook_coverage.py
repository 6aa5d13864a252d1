"""Fails when a hook of ``hookspecs.CONTRACTS`` has no test showing a plugin change what
the real system does, or when its façade does not call it as its contract says.

A hook counts as covered by a test (here or in ``plugins/*/tests``) marked
``@pytest.mark.hook_effect("piw_<hook>")`` that asserts something (an ``assert``, a
``wait_until`` or a ``pytest.raises``), runs the real system — a real host (the
`harness` or `workflow_host` fixture, directly or through a fixture of its package) or
the real CLI in a subprocess (`home_env`/`workflow_home` plus `run_cli`) — and loads a
plugin that implements the hook: a plugin source the test or its helpers hold, or a
plugin distribution of ``plugins/`` it loads (``use_entry_points("markdown")`` or a
``markdown_plugin`` fixture). Calling the façade in-process or registering a temporary
plugin object does not count: that shows pluggy dispatching, not the host keeping the
contract.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from pathlib import Path

from pi_workflows import hookspecs, plugins

TESTS_DIR = Path(__file__).resolve().parent
PLUGINS_DIR = TESTS_DIR.parent / "plugins"
HOST_FIXTURES = {"harness", "workflow_host"}
CLI_FIXTURES = {"home_env", "workflow_home"}


# What a test does to check the effect it is marked with.
ASSERTING_CALLS = {"wait_until", "raises"}


def _hookspec_names() -> list[str]:
    return sorted(hookspecs.CONTRACTS)


def _facades_by_hook() -> dict[str, set[str]]:
    """Public functions of plugins.py and the hook names their bodies mention."""
    tree = ast.parse(inspect.getsource(plugins))
    facades: dict[str, set[str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                if inner.value.startswith("piw_"):
                    facades.setdefault(inner.value, set()).add(node.name)
    return facades


@dataclass
class _Function:
    params: list[str]
    names: set[str] = field(default_factory=set)  # names and attributes it refers to
    text: str = ""  # its string constants
    entry_points: set[str] = field(default_factory=set)  # named in use_entry_points(...)
    effects: set[str] = field(default_factory=set)  # hooks of @pytest.mark.hook_effect
    asserts: bool = False  # an assert, wait_until(...) or pytest.raises(...) in its body


def _marked_effects(node: ast.FunctionDef) -> set[str]:
    return {
        arg.value
        for decorator in node.decorator_list
        if isinstance(decorator, ast.Call)
        and ast.unparse(decorator.func).endswith("mark.hook_effect")
        for arg in decorator.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


def _asserts(node: ast.FunctionDef) -> bool:
    return any(
        isinstance(inner, ast.Assert)
        or (
            isinstance(inner, ast.Call)
            and ast.unparse(inner.func).rsplit(".", 1)[-1] in ASSERTING_CALLS
        )
        for inner in ast.walk(node)
    )


def _strings(node: ast.AST) -> str:
    return "\n".join(
        inner.value
        for inner in ast.walk(node)
        if isinstance(inner, ast.Constant) and isinstance(inner.value, str)
    )


def _index_tests() -> tuple[dict[str, _Function], dict[str, str], list[str]]:
    """Module-level functions and string constants of every test module, by name."""
    functions: dict[str, _Function] = {}
    constants: dict[str, str] = {}
    tests: list[str] = []
    paths = [*TESTS_DIR.rglob("*.py"), *PLUGINS_DIR.glob("*/tests/**/*.py")]
    for path in paths:
        if path.resolve() == Path(__file__).resolve():
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = constants.get(target.id, "") + _strings(node)
            elif isinstance(node, ast.FunctionDef):
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                key = f"{path}:{node.name}" if node.name.startswith("test_") else node.name
                function = functions.setdefault(key, _Function([a.arg for a in node.args.args]))
                function.names |= names
                function.text += _strings(node)
                function.entry_points |= {
                    arg.value
                    for call in ast.walk(node)
                    if isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "use_entry_points"
                    for arg in call.args
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                }
                if node.name.startswith("test_"):
                    function.effects |= _marked_effects(node)
                    function.asserts = function.asserts or _asserts(node)
                    tests.append(key)
    return functions, constants, tests


def _fixture_chain(test: str, functions: dict[str, _Function]) -> set[str]:
    seen: set[str] = set()
    pending = list(functions[test].params)
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending += functions[name].params if name in functions else []
    return seen


def _reachable_text(test: str, functions: dict[str, _Function], constants: dict[str, str]) -> str:
    """Strings the test, its fixtures and helpers hold, and the constants they name."""
    seen: set[str] = set()
    pending = [test, *_fixture_chain(test, functions)]
    texts = []
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in constants:
            texts.append(constants[name])
        function = functions.get(name)
        if function is not None:
            texts.append(function.text)
            pending += [n for n in function.names if n in functions or n in constants]
    return "\n".join(texts)


def _distribution_sources() -> dict[str, str]:
    """`<name>_plugin` fixture → the Python sources of plugins/pi-workflows-<name>."""
    return {
        directory.name.removeprefix("pi-workflows-") + "_plugin": "\n".join(
            path.read_text() for path in directory.rglob("*.py") if "node_modules" not in path.parts
        )
        for directory in PLUGINS_DIR.iterdir()
        if directory.is_dir()
    }


def _effects_shown_by_the_real_system() -> dict[str, list[str]]:
    """Hook → the marked tests that show its effect; a marked test that does not run the
    real system, load a plugin implementing the hook and assert is reported as `None`."""
    functions, constants, tests = _index_tests()
    distributions = _distribution_sources()
    shown: dict[str, list[str]] = {}
    for test in tests:
        function = functions[test]
        if not function.effects:
            continue
        chain = _fixture_chain(test, functions)
        text = _reachable_text(test, functions, constants)
        runs_cli = bool(CLI_FIXTURES & chain) and "run_cli" in function.names
        loaded = {name.removesuffix("_plugin") for name in chain} | function.entry_points
        sources = text + "".join(distributions.get(name, "") for name in loaded)
        for hook in function.effects:
            real = bool(HOST_FIXTURES & chain) or runs_cli
            implemented = f"def {hook}(" in sources
            shown.setdefault(hook, []).append(
                test if real and implemented and function.asserts else f"not shown: {test}"
            )
    return shown


def _facade_returns() -> dict[str, set[str]]:
    """Hook → the return annotations of the façade functions that name it."""
    annotations: dict[str, set[str]] = {}
    for hook, facades in _facades_by_hook().items():
        for facade in facades:
            annotation = inspect.signature(getattr(plugins, facade)).return_annotation
            annotations.setdefault(hook, set()).add(str(annotation))
    return annotations


def _without_none(annotation: str) -> str:
    return " | ".join(part for part in annotation.split(" | ") if part != "None")


def test_every_hookspec_has_a_contract_and_a_facade():
    specs = sorted(name for name in vars(hookspecs) if name.startswith("piw_"))
    assert specs == _hookspec_names(), "every spec is declared with @hook(HookContract(...))"
    facades = _facades_by_hook()
    missing = [name for name in _hookspec_names() if name not in facades]
    assert missing == [], f"hooks without a façade function in pi_workflows/plugins.py: {missing}"


def test_the_facade_returns_what_each_contract_promises():
    # A required first-result hook's façade never returns None; a notification's returns
    # nothing; the others return what the spec does (collect façades shape their answers).
    returns = _facade_returns()
    wrong = {}
    for hook, contract in hookspecs.CONTRACTS.items():
        if contract.kind == "collect":
            continue
        expected = {
            "notification": "None",
            "first-result": _without_none(contract.returns)
            if contract.required
            else contract.returns,
        }[contract.kind]
        # Façades that run the hook under the deadline return what they chose from it.
        found = {r for r in returns[hook] if r not in ("ClaimChoice", "bool")}
        if found != {expected}:
            wrong[hook] = (expected, sorted(found))
    assert wrong == {}, f"hook → (contract's return, façade returns): {wrong}"


def test_only_isolated_hooks_refuse_wrappers():
    isolated = {name for name, c in hookspecs.CONTRACTS.items() if c.isolated}
    assert plugins.ONE_AT_A_TIME_HOOKS == isolated


def test_every_hook_is_shown_changing_a_running_host():
    hooks = _hookspec_names()
    assert len(hooks) >= 19
    shown = _effects_shown_by_the_real_system()
    assert sorted(set(shown) - set(hooks)) == [], "a hook_effect mark names no hook"
    not_shown = {
        hook: tests
        for hook, tests in shown.items()
        if any(t.startswith("not shown") for t in tests)
    }
    assert not_shown == {}, (
        "tests marked hook_effect that do not run a real host (or the real CLI), load a plugin "
        f"implementing the hook and assert: {not_shown}"
    )
    unshown = sorted(set(hooks) - set(shown))
    assert unshown == [], (
        f"hooks no real-host (or real-CLI) test shows the effect of: {unshown}; write a test "
        "that starts a host with a plugin implementing each, asserts what it changes, and mark "
        "it @pytest.mark.hook_effect(HOOK) (see tests/host/test_hook_contract.py)"
    )
