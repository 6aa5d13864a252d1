"""The files of a new plugin distribution (`pi-workflows plugins new`).

Stubs are generated from the hook specifications themselves (signature and the first
paragraph of the docstring), so a new hook or a changed docstring needs no template edit.
"""

from __future__ import annotations

import difflib
import inspect
import re
import shutil
import tempfile
import textwrap
from pathlib import Path

from .. import __version__, hookspecs
from ..errors import InvalidInputError

PLUGIN_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")
# Names a stub's annotations may use, and where each comes from (type checking only).
ANNOTATION_IMPORTS = {
    "Any": "from typing import Any",
    "Callable": "from collections.abc import Callable",
    "Path": "from pathlib import Path",
    "click": "import click",
    "peewee": "import peewee",
}
RECORD_NAMES = re.compile(r"(?<![.\w])([A-Z][A-Za-z]+)\b")  # not peewee.Database


def hook_names() -> list[str]:
    return sorted(hookspecs.CONTRACTS)


def check_hooks(hooks: list[str]) -> list[str]:
    """The hooks, each checked against the specifications (a typo gets the closest name)."""
    known = hook_names()
    for hook in hooks:
        if hook not in known:
            close = difflib.get_close_matches(hook, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "see 'pi-workflows plugins'"
            raise InvalidInputError(f"There is no hook {hook!r}; {hint}")
    if not hooks:
        raise InvalidInputError("Name at least one hook with --hook (see 'pi-workflows plugins').")
    return list(dict.fromkeys(hooks))


def write_distribution(name: str, hooks: list[str], directory: Path) -> Path:
    """Write the distribution for plugin `name` into `directory` (which must not exist).

    Everything is written to a temporary sibling first and renamed at the end, so a
    failure leaves nothing half-written.
    """
    if not PLUGIN_NAME.match(name):
        raise InvalidInputError(
            f"Plugin name {name!r} must be lower-case letters, digits, '-' or '_' (at most "
            "40), starting with a letter."
        )
    hooks = check_hooks(hooks)
    if directory.exists():
        raise InvalidInputError(f"{directory} already exists; choose another --directory.")
    directory.parent.mkdir(parents=True, exist_ok=True)
    package = "piw_" + name.replace("-", "_")
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        files = {
            "pyproject.toml": _pyproject(name, package),
            "README.md": _readme(name, hooks),
            f"{package}/__init__.py": f'"""The {name} plugin for pi-workflows."""\n',
            f"{package}/plugin.py": _plugin_module(name, hooks),
            "tests/test_plugin.py": _test_module(name, package, hooks),
        }
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _pyproject(name: str, package: str) -> str:
    return f"""\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "pi-workflows-{name}"
version = "0.1.0"
description = "pi-workflows plugin {name}."
requires-python = ">=3.11"
dependencies = ["pi-workflows>={__version__}"]

[project.optional-dependencies]
test = ["pytest>=8"]

[project.entry-points.pi_workflows]
{name} = "{package}.plugin"

[tool.setuptools.packages.find]
include = ["{package}*"]

[tool.ruff]
line-length = 100
"""


def _readme(name: str, hooks: list[str]) -> str:
    listed = "\n".join(f"- `{hook}`" for hook in hooks)
    return f"""\
# pi-workflows-{name}

A pi-workflows plugin implementing:

{listed}

    pip install -e '.[test]'
    pi-workflows plugins        # lists `{name}` and where it runs in each hook's call order
    pytest -q                   # the tests use pi-workflows' test kit (pi_workflows.testing)

A plugin imports only `pi_workflows.plugin` (its tests also `pi_workflows.testing`); the
other modules are internal. The hook reference is `pi_workflows/hookspecs.py` (and the
documentation site).
"""


def _plugin_module(name: str, hooks: list[str]) -> str:
    annotations = " ".join(_signature(hook) for hook in hooks)
    used = [
        line for word, line in ANNOTATION_IMPORTS.items() if re.search(rf"\b{word}\b", annotations)
    ]
    standard = sorted(line for line in used if line.startswith("from "))
    third_party = sorted(line for line in used if line.startswith("import "))
    records = sorted(
        word
        for word in set(RECORD_NAMES.findall(annotations))
        if word not in ANNOTATION_IMPORTS and word != "None"
    )
    if records:
        names = ", ".join(records)
        if len(names) > 60:  # wrapped the way ruff format wraps it
            names = "(\n" + "".join(f"    {record},\n" for record in records) + ")"
        third_party.append(f"from pi_workflows.plugin import {names}")
    blocks = ["\n".join(block) for block in (standard, third_party) if block]
    header = f'''\
"""The hooks of the {name} plugin.

Each stub lets the next implementation (finally the built-in) decide; replace its body
with your behaviour. The full contract of every hook is its docstring in
pi_workflows/hookspecs.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pi_workflows.plugin import hookimpl

'''
    if blocks:
        header += "if TYPE_CHECKING:\n" + textwrap.indent("\n\n".join(blocks), "    ") + "\n\n"
    return header + "\n" + "\n\n".join(_stub(hook) for hook in hooks)


def _signature(hook: str) -> str:
    return str(inspect.signature(getattr(hookspecs, hook))).replace("'", "")


def _stub(hook: str) -> str:
    spec = getattr(hookspecs, hook)
    signature = _signature(hook)
    definition = f"def {hook}{signature}:"
    if len(definition) > 100:  # wrapped the way ruff format wraps it
        parameters, returns = signature[1:].split(") -> ")
        definition = f"def {hook}(\n    {parameters}\n) -> {returns}:"
    summary = (inspect.getdoc(spec) or "").split("\n\n")[0]
    doc = textwrap.indent(f"{summary}\n\nSee pi_workflows.hookspecs.{hook}.", "    ").lstrip()
    if signature.endswith("-> None"):
        body = ""
    elif hookspecs.CONTRACTS[hook].kind == "first-result":
        body = "    return None  # let the next implementation decide\n"
    elif hook == "piw_may_claim":
        body = "    return None  # None or True allows; False vetoes\n"
    else:
        body = "    return None  # contributes nothing\n"
    return f'@hookimpl\n{definition}\n    """{doc}\n    """\n{body}'


def _test_module(name: str, package: str, hooks: list[str]) -> str:
    hook_list = "".join(f'\n    "{hook}",' for hook in hooks)
    return f'''\
"""Tests of the {name} plugin, written with pi-workflows' test kit (pi_workflows.testing)."""

from __future__ import annotations

import json

from pi_workflows.testing import IsolatedPlugins, WorkflowHost

from {package} import plugin

HOOKS = [{hook_list}
]


def test_the_plugin_answers_its_hooks_first(workflow_plugins: IsolatedPlugins):
    workflow_plugins.register(plugin, name="{name}")

    hooks = workflow_plugins.hooks.describe_hooks()
    order = {{hook["hook"]: hook["implementations"] for hook in hooks}}

    for hook in HOOKS:
        assert order[hook][0] == "{name}", hook


def test_a_running_host_loads_the_plugin(workflow_host: WorkflowHost):
    workflow_host.use_entry_points("{name}")
    workflow_host.start()

    run_id = workflow_host.start_run("hello", {{"name": "Ada"}})

    assert workflow_host.wait_for_run(run_id)["status"] == "completed"
    listed = json.loads(workflow_host.cli("plugins", "--json").stdout)
    assert "{name}" in [entry["name"] for entry in listed]
'''
