"""`pi-workflows plugins new`: the distribution it writes installs and passes its own tests."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from pi_workflows.testing import WorkflowHome

HOOKS = ("piw_unproductive_turn_limit", "piw_register_commands", "piw_worker_run_command")


def _scratch_venv(root: Path) -> Path:
    """A venv that sees this one's packages (pi-workflows, pytest) through a .pth hook.

    Installing the generated distribution there leaves the suite's own venv untouched.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "suite_packages.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def test_a_generated_plugin_installs_and_its_test_passes(workflow_home: WorkflowHome):
    target = workflow_home.root / "pi-workflows-limits"
    hooks = [argument for hook in HOOKS for argument in ("--hook", hook)]

    written = workflow_home.run_cli("plugins", "new", "limits", *hooks, "--directory", str(target))

    assert written.returncode == 0, written.stderr
    assert written.stdout.startswith(f"wrote {target}\n")
    plugin = (target / "piw_limits" / "plugin.py").read_text()
    for hook in HOOKS:
        assert f"@hookimpl\ndef {hook}(" in plugin
    assert 'limits = "piw_limits.plugin"' in (target / "pyproject.toml").read_text()
    python = _scratch_venv(workflow_home.root / "venv")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", target],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    tests = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(target / "tests")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=target,
        env=workflow_home.env,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "2 passed" in tests.stdout


def test_bad_requests_write_nothing(workflow_home: WorkflowHome):
    target = workflow_home.root / "out"

    typo = workflow_home.run_cli(
        "plugins", "new", "x", "--hook", "piw_may_clam", "--directory", str(target)
    )
    no_hook = workflow_home.run_cli("plugins", "new", "x", "--directory", str(target))
    bad_name = workflow_home.run_cli(
        "plugins", "new", "Bad Name", "--hook", "piw_may_claim", "--directory", str(target)
    )
    target.mkdir()
    taken = workflow_home.run_cli(
        "plugins", "new", "x", "--hook", "piw_may_claim", "--directory", str(target)
    )

    assert typo.stderr == "Error: There is no hook 'piw_may_clam'; did you mean piw_may_claim?\n"
    assert no_hook.stderr.startswith("Error: Name at least one hook with --hook")
    assert bad_name.stderr.startswith("Error: Plugin name 'Bad Name' must be lower-case")
    assert taken.stderr == f"Error: {target} already exists; choose another --directory.\n"
    assert [r.returncode for r in (typo, no_hook, bad_name, taken)] == [1, 1, 1, 1]
    assert list(target.iterdir()) == []
    assert sorted(p.name for p in workflow_home.root.iterdir() if p.name.startswith(".")) == []
