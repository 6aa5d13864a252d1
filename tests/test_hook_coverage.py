"""Fails when a hookspec has no test calling it (datasette's trick, made a little stricter).

A hook counts as tested when some test file, other than this one, calls its façade
function in `pi_workflows.plugins` (``plugins.<facade>(``) or implements it in a test plugin
(``def piw_<hook>(``). The façade for each hook is found by reading `plugins.py`.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pi_workflows import hookspecs, plugins

TESTS_DIR = Path(__file__).resolve().parent


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


def _test_sources() -> str:
    own = Path(__file__).resolve()
    return "\n".join(path.read_text() for path in TESTS_DIR.rglob("*.py") if path.resolve() != own)


def test_every_hookspec_has_a_facade():
    facades = _facades_by_hook()
    missing = [name for name in _hookspec_names() if name not in facades]
    assert missing == [], f"hooks without a façade function in pi_workflows/plugins.py: {missing}"


def test_every_hookspec_is_exercised_by_a_test():
    assert len(_hookspec_names()) >= 16
    facades = _facades_by_hook()
    sources = _test_sources()
    untested = [
        name
        for name in _hookspec_names()
        if f"def {name}(" not in sources
        and not any(f"plugins.{facade}(" in sources for facade in facades.get(name, ()))
    ]
    assert untested == [], f"hookspecs that no test calls or implements: {untested}"


def test_every_facade_is_called_by_a_test():
    sources = _test_sources()
    uncalled = sorted(
        facade
        for names in _facades_by_hook().values()
        for facade in names
        if f"plugins.{facade}(" not in sources
    )
    assert uncalled == [], f"façade functions that no test calls: {uncalled}"
