"""A workflow file that starts a daemon at import does not hold the CLI's output open
(issue 30, item 7).

The daemon is real: `setsid sleep` started by the workflow file while it is imported in
a discovery child. The command must finish long before the daemon does.
"""

from __future__ import annotations

import time

import pytest

from pi_workflows.testing import WorkflowHome, installed_entry_points, short_temp_dir

pytestmark = pytest.mark.integration

DAEMON_S = 60
DAEMON_AT_IMPORT = f"""
import subprocess

from pi_workflows import compute, workflow

subprocess.Popen(["sleep", "{DAEMON_S}"], start_new_session=True)

WORKFLOW = workflow(
    name="daemonic", start_at="a", nodes={{"a": compute(lambda ctx: {{}})}}, edges=[]
)
"""


def test_a_daemon_started_at_import_does_not_keep_the_command_waiting():
    home = WorkflowHome(short_temp_dir(), entry_points=installed_entry_points())
    home.write_workflow("daemonic", DAEMON_AT_IMPORT)
    try:
        began = time.monotonic()
        result = home.run_cli("workflows")
        took = time.monotonic() - began
    finally:
        home.cleanup()  # kills processes left in the project (the daemon)

    assert result.returncode == 0, result.stderr
    assert "daemonic" in result.stdout
    assert took < DAEMON_S / 3
