"""The types, checked with `mypy` as [tool.mypy] in pyproject.toml sets it.

.ci/run runs the same command; this test puts it under the README's test command.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
# mypy is in the test extra; run as a module of this interpreter.
MYPY = [sys.executable, "-m", "mypy"]


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MYPY, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_package_has_no_type_errors(tmp_path: Path):
    result = mypy("--cache-dir", str(tmp_path / "cache"))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_strict_modules_refuse_what_the_rest_accepts(tmp_path: Path):
    # The repository's own settings, applied to one untyped function placed in a strict
    # package (the store) and in one checked at the default level (the engine).
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    config.pop("packages")
    untyped = "def shape(row):\n    return row\n\n\nlabel: int = shape('x')\n"
    for package in ("storage", "engine"):
        module = tmp_path / "pi_workflows" / package
        module.mkdir(parents=True)
        (module / "__init__.py").write_text("")
        (module / "probe.py").write_text(untyped)
    (tmp_path / "pi_workflows" / "__init__.py").write_text("")
    config_file = tmp_path / "types.toml"
    config_file.write_text(tomli_w.dumps({"tool": {"mypy": config}}))

    result = mypy(
        "--config-file",
        str(config_file),
        "--cache-dir",
        str(tmp_path / "cache"),
        "pi_workflows",
        cwd=tmp_path,
    )

    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert any(
        line.startswith("pi_workflows/storage/probe.py:1:") and "[no-untyped-def]" in line
        for line in errors
    ), errors
    assert not any(line.startswith("pi_workflows/engine/") for line in errors), errors
