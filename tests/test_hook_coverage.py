"""Fails when a hookspec has no test showing a plugin change what the real system does.

A hook counts as covered only by a test (here or in ``plugins/*/tests``) that runs the
real system — a real host (the `harness` or `workflow_host` fixture, directly or through
a fixture of its package) or the real CLI in a subprocess (`home_env`/`workflow_home`
plus `run_cli`) — and loads a plugin that implements the hook: a plugin source the test
or its helpers hold (a string with ``def piw_<hook>(``), or a plugin distribution of
``plugins/`` it loads (``use_entry_points("markdown")`` or a ``markdown_plugin`` fixture).
Calling the façade in-process or registering a temporary plugin object does not count:
that shows pluggy dispatching, not the host keeping the contract.
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


def _hookspec_names() -> list[str]:
    return sorted(
        name
        for name, value in vars(hookspecs).items()
        if name.startswith("piw_") and callable(value)
    )


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


def _hooks_covered_by_the_real_system() -> set[str]:
    functions, constants, tests = _index_tests()
    distributions = _distribution_sources()
    covered: set[str] = set()
    for test in tests:
        chain = _fixture_chain(test, functions)
        text = _reachable_text(test, functions, constants)
        runs_cli = bool(CLI_FIXTURES & chain) and "run_cli" in functions[test].names
        if not HOST_FIXTURES & chain and not runs_cli:
            continue
        loaded = {name.removesuffix("_plugin") for name in chain} | functions[test].entry_points
        sources = text + "".join(distributions.get(name, "") for name in loaded)
        covered |= {hook for hook in _hookspec_names() if f"def {hook}(" in sources}
    return covered


def test_every_hookspec_has_a_facade():
    facades = _facades_by_hook()
    missing = [name for name in _hookspec_names() if name not in facades]
    assert missing == [], f"hooks without a façade function in pi_workflows/plugins.py: {missing}"


def test_every_hookspec_is_shown_changing_a_running_host():
    hooks = _hookspec_names()
    assert len(hooks) >= 16
    uncovered = sorted(set(hooks) - _hooks_covered_by_the_real_system())
    assert uncovered == [], (
        f"hooks no real-host (or real-CLI) test loads a plugin for: {uncovered}; write a "
        "test that starts a host with a plugin implementing each (see "
        "tests/host/test_hook_contract.py)"
    )
