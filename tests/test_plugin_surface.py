"""The public plugin namespace: what plugins and their documentation may import.

Plugins import `pi_workflows.plugin` (their tests also `pi_workflows.testing`) and the
authoring names of `pi_workflows`; everything else is internal. These tests read the
bundled plugins, the documentation's examples and a freshly generated scaffold.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import plugin, plugin_imports
from pi_workflows.cli.plugin_template import hook_names, write_distribution

ROOT = Path(__file__).resolve().parents[1]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def internal_imports(source: str) -> Iterator[str]:
    """Every `pi_workflows` import in `source` outside the public namespace, as written."""
    for module, names in plugin_imports.internal_imports(source):
        yield f"from {module} import {', '.join(names)}" if names else f"import {module}"


def plugin_sources() -> Iterator[tuple[str, str]]:
    for path in sorted(ROOT.glob("plugins/pi-workflows-*/**/*.py")):
        if "node_modules" not in path.parts:
            yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted((ROOT / "docs" / "reference" / "hook-examples").glob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted([ROOT / "docs" / "plugins.md", *(ROOT / "docs").glob("tutorial/*.md")]):
        for number, block in enumerate(PYTHON_BLOCK.findall(path.read_text())):
            yield f"{path.relative_to(ROOT)} (python block {number + 1})", block


def test_bundled_plugins_and_docs_import_only_the_public_namespace():
    found = {where: list(internal_imports(source)) for where, source in plugin_sources()}

    assert len(found) > 20  # the scan saw the plugins and the examples
    assert {where: imports for where, imports in found.items() if imports} == {}


def test_the_scaffold_imports_only_the_public_namespace(tmp_path: Path):
    # Every hook at once, so every record a stub's annotation names is imported.
    written = write_distribution("everything", hook_names(), tmp_path / "everything")

    sources = sorted(written.rglob("*.py"))
    assert {path.name for path in sources} >= {"plugin.py", "test_plugin.py"}
    for path in sources:
        assert list(internal_imports(path.read_text())) == [], path.name


def test_the_scan_catches_an_internal_import():
    source = "from pi_workflows.storage import state_status\nfrom pi_workflows import plugins\n"

    assert list(internal_imports(source)) == [
        "from pi_workflows.storage import state_status",
        "from pi_workflows import plugins",
    ]


def test_every_public_name_resolves():
    unresolved = [name for name in plugin.__all__ if getattr(plugin, name, None) is None]

    assert unresolved == []
    # Every name it loads on first use is listed (what type checkers and `dir()` see).
    assert set(plugin._SOURCES) <= set(plugin.__all__)
    with pytest.raises(AttributeError, match="no attribute 'storage'"):
        plugin.storage  # noqa: B018 - internal modules are not reachable through it


def test_importing_hookimpl_loads_neither_the_store_nor_the_client():
    # A plugin module is imported whenever the command line starts.
    code = (
        "import sys\n"
        "from pi_workflows.plugin import hookimpl\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pi_workflows.storage', "
        "'pi_workflows.client', 'pi_workflows.cli', 'peewee'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )

    assert result.stdout.strip() == "[]"


def test_turn_context_is_the_protocol_the_host_implements():
    from pi_workflows.host.session_turns import TurnContext as HostTurnContext

    members = {
        name
        for name in vars(plugin.TurnContext)
        if not name.startswith("_") and callable(getattr(plugin.TurnContext, name))
    }
    assert members
    assert members <= set(dir(HostTurnContext))
