"""The module layers of [tool.importlinter] in pyproject.toml, checked with `lint-imports`.

.ci/run runs the same command; this test puts it under the README's test command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
# The console script installed beside this interpreter (import-linter is in the test extra).
LINT_IMPORTS = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo"]
PLUGIN_CONTRACT = "Plugins import only the public namespace"


def lint_imports(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None):
    return subprocess.run(
        [*LINT_IMPORTS, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_every_layer_contract_is_kept():
    result = lint_imports()

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_plugin_importing_an_internal_module_breaks_its_contract(tmp_path: Path):
    # The repository's own plugin contract, applied to a plugin that reads the store directly.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["name"].startswith(PLUGIN_CONTRACT)]
    package = tmp_path / "piw_nosy"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from pi_workflows.plugin import hookimpl\nfrom pi_workflows.storage import run_exists\n"
    )
    contract = {**contract, "id": "plugins", "source_modules": ["piw_nosy"]}
    settings = {"root_packages": ["pi_workflows", "piw_nosy"], "contracts": [contract]}
    config_file = tmp_path / "layers.toml"
    config_file.write_text(tomli_w.dumps({"tool": {"importlinter": settings}}))

    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    result = lint_imports(str(config_file), cwd=tmp_path, env=env)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "piw_nosy -> pi_workflows.storage" in result.stdout
