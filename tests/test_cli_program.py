"""The installed `pi-workflows` program ends as Python ends a program (exit status,
`atexit` handlers, output flushed into a pipe), without tearing its modules down
(`cli.main.run`; 7-15 ms of a ~100 ms `run list`, docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from pi_workflows import __version__
from pi_workflows.testing import WorkflowHome, WorkflowHost

PROGRAM = Path(sys.executable).parent / "pi-workflows"


def _run(workflow_home: WorkflowHome, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=workflow_home.env, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_installed_program_is_run_and_keeps_python_exit_statuses(
    workflow_home: WorkflowHome,
):
    [script] = entry_points(group="console_scripts", name="pi-workflows")
    assert script.value == "pi_workflows.cli.main:run"
    assert "from pi_workflows.cli.main import run" in PROGRAM.read_text()

    version = _run(workflow_home, str(PROGRAM), "--version")
    assert (version.returncode, version.stdout) == (0, f"pi-workflows, version {__version__}\n")
    usage = _run(workflow_home, str(PROGRAM), "--no-such-option")
    assert usage.returncode == 2 and "No such option '--no-such-option'" in usage.stderr
    refused = _run(workflow_home, str(PROGRAM), "--no-autostart", "run", "status", "nope")
    assert refused.returncode == 1 and refused.stderr.startswith("Error: ")


def test_run_flushes_what_was_printed_and_runs_atexit_handlers(
    workflow_home: WorkflowHome, tmp_path: Path
):
    marker = tmp_path / "atexit-ran"
    program = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
        "print('x' * 200_000, end='')  # more than a pipe holds: flushed at the end\n"
        "sys.argv = ['pi-workflows', '--version']\n"
        "from pi_workflows.cli.main import run\n"
        "run()\n"
    )
    ended = _run(workflow_home, sys.executable, "-c", program)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout == "x" * 200_000 + f"pi-workflows, version {__version__}\n"
    assert marker.read_text() == "ran"


def test_a_client_command_imports_only_what_it_uses(workflow_home: WorkflowHome):
    """Each import is paid by every command (docs/performance.md: `run list`): the
    settings (TOML, temporary files) load only to start a host, the viewer's text
    helpers only for `run transcript`."""
    listed = _run(
        workflow_home,
        *(sys.executable, "-X", "importtime", "-m", "pi_workflows", "--no-autostart"),
        *("run", "list"),
    )
    assert listed.returncode == 1 and "No workflow host is running" in listed.stderr
    imported = {
        line.split("|")[-1].strip()
        for line in listed.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "pi_workflows.client.autostart" in imported  # the command's own path was taken
    assert not imported & {"pi_workflows.settings", "tomllib", "tempfile", "pi_workflows.view.text"}


def test_a_client_command_on_a_live_host_parses_no_settings_file_it_does_not_find(
    workflow_host: WorkflowHost,
):
    """Against a live host a command compares the settings it asks for with the host's
    (`cli.context.warn_if_settings_differ`): with no settings file there is no TOML to
    parse and nothing to write, so neither parser nor temporary files load."""
    workflow_host.start()
    listed = _run(
        workflow_host,
        *(sys.executable, "-X", "importtime", "-m", "pi_workflows", "--no-autostart"),
        *("run", "list"),
    )
    assert listed.returncode == 0, listed.stderr
    imported = {
        line.split("|")[-1].strip()
        for line in listed.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "pi_workflows.settings" in imported  # the comparison ran
    assert not imported & {"tomllib", "tempfile", "tomli_w"}
