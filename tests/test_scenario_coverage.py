"""`pytest --scenarios` reports, per catalog section, which applicable scenarios have a test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

CATALOG = """\
# Scenarios

## 1. Hosts

| id | scenario | project decision |
|---|---|---|
| 1.1 | Clean start and stop |  |
| 1.2 | A second host is refused |  |
| 1.3 | State is pruned | N/A: no pruning here |

## A. Appendix

| id | scenario | project decision |
|---|---|---|
| A.1 | Run-command choice | differs: no mounted children |
"""

TESTS = """\
import pytest

@pytest.mark.scenario("1.1")
def test_start_and_stop():
    raise AssertionError("--scenarios must not run tests")

@pytest.mark.scenario("1.1", "1.2")
def test_second_host():
    pass

def test_unmarked():
    pass
"""


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A fresh pytest in `project` with only the coverage plugin (from this repository)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.scenario_coverage", "-p", "no:cacheprovider"]
        + ["-c", str(project / "pytest.ini"), "--rootdir", str(project), *args],
        cwd=project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nscenario_catalog = catalog.md\naddopts = --strict-markers\n"
    )
    (tmp_path / "catalog.md").write_text(CATALOG)
    (tmp_path / "test_things.py").write_text(TESTS)
    return tmp_path


def test_scenarios_prints_tested_and_untested_ids_per_section_without_running_tests(project):
    result = _pytest(project, "--scenarios", "test_things.py")

    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    section = lines.index("1. Hosts: 2/2 tested (100.0 %)")
    assert lines[section + 1] == "  tested:   1.1 1.2"
    # The not-applicable 1.3 is neither counted nor listed (pytest's closing line, which
    # says how long it took, may read "in 1.31s").
    assert not any("1.3" in line for line in lines if "no tests ran" not in line)
    appendix = lines.index("A. Appendix: 0/1 tested (0.0 %)")
    untested = "  untested: A.1 Run-command choice [differs: no mounted children]"
    assert lines[appendix + 1] == untested
    assert "all: 2/3 applicable scenarios tested (66.7 %); 1 not applicable" in lines
    assert "no tests ran" in result.stdout


def test_a_mark_naming_an_unknown_or_not_applicable_id_stops_collection(project):
    (project / "test_wrong.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.scenario('1.9')\ndef test_typo():\n    pass\n\n"
        "@pytest.mark.scenario('1.3')\ndef test_pruning():\n    pass\n"
    )

    result = _pytest(project, "test_wrong.py")

    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "test_wrong.py::test_typo: scenario '1.9' is not in the catalog" in result.stderr
    assert "test_wrong.py::test_pruning: scenario 1.3 is marked N/A: no pruning here" in (
        result.stderr
    )


def test_the_repository_catalog_lists_every_reference_section():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--scenarios", "-q", "-p", "no:cacheprovider"]
        + ["tests/test_scenario_coverage.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    (totals,) = re.findall(
        r"^all: 0/(\d+) applicable .*; (\d+) not applicable$", result.stdout, re.M
    )
    # The reference catalogues 210 scenarios (203 and 7 in its appendix).
    assert sum(int(count) for count in totals) == 210
    sections = re.findall(r"^(\w+)\. .*: \d+/\d+ tested", result.stdout, re.MULTILINE)
    assert sections == [*(str(number) for number in range(1, 12)), "A"]
