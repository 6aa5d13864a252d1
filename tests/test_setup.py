"""README.md's first command sets up everything the suite imports and runs.

These fail (never skip) when something is missing, naming the command that installs it, so a
set-up that stops installing a piece shows up as a failing test, not as a smaller suite.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, readme_setup_command, require_distribution

# The distributions of plugins/ whose entry points and tests the suite loads.
PLUGIN_PACKAGES = {
    "pi-workflows-audit": "piw_audit",
    "pi-workflows-webhook": "piw_webhook",
    "pi-workflows-markdown": "piw_markdown",
    "pi-workflows-otel": "piw_otel",
    "pi-workflows-pi": "piw_pi",
}
PI_PACKAGE_DIR = REPO_ROOT / "plugins" / "pi-workflows-pi"


def missing(what: str) -> None:
    pytest.fail(f"{what}: run README.md's first command ({readme_setup_command()}).", pytrace=False)


def test_the_readme_sets_up_through_scripts_setup():
    assert "scripts/setup" in readme_setup_command()


@pytest.mark.parametrize("distribution", sorted(PLUGIN_PACKAGES))
def test_every_plugin_distribution_is_installed_from_this_clone(distribution):
    require_distribution(distribution)
    package = importlib.import_module(PLUGIN_PACKAGES[distribution])
    # Editable from this clone, so the tests exercise the code that sits next to them.
    assert REPO_ROOT in Path(package.__file__).resolve().parents


def test_the_pi_coding_agent_is_installed_from_the_lock_file():
    pi = PI_PACKAGE_DIR / "node_modules" / ".bin" / "pi"
    if not os.access(pi, os.X_OK):
        missing(f"{pi} is missing (`npm ci` in plugins/pi-workflows-pi)")
    wanted = json.loads((PI_PACKAGE_DIR / "package.json").read_text())["dependencies"]
    installed = PI_PACKAGE_DIR / "node_modules" / "@mariozechner" / "pi-coding-agent"
    version = json.loads((installed / "package.json").read_text())["version"]
    assert version == wanted["@mariozechner/pi-coding-agent"]
