"""A plugin failing in a claim pass shows in `host status`, not only in the log."""

from __future__ import annotations

import json

from pi_workflows.testing import WorkflowHost, wait_until

FAULTY_CLAIMING = """
import os
from pathlib import Path

from pi_workflows import hookimpl


@hookimpl
def piw_select_run_to_claim(candidates, host):
    if Path(os.environ["CLAIM_FAULT"]).exists():
        raise RuntimeError("the priority table is unreadable")
    return None
"""


def _status(host: WorkflowHost) -> dict:
    return json.loads(host.cli("host", "status", "--json").stdout)


def test_a_failing_claim_plugin_shows_in_host_status_until_it_recovers(
    workflow_host: WorkflowHost,
):
    fault = workflow_host.root / "fault"
    fault.touch()
    workflow_host.add_plugin("piw_faulty_claiming", FAULTY_CLAIMING)
    workflow_host.start(CLAIM_FAULT=str(fault))

    run_id = workflow_host.start_run("hello", {"name": "Ada"})
    failure = wait_until(lambda: _status(workflow_host)["claimPassFailure"], what="a failure")
    text = workflow_host.cli("host", "status").stdout

    assert failure == (
        "Plugin 'piw_faulty_claiming' failed in hook piw_select_run_to_claim: "
        "RuntimeError: the priority table is unreadable"
    )
    assert f"claim pass failing: {failure}" in text
    assert json.loads(workflow_host.cli("run", "status", run_id, "--json").stdout)["status"] == (
        "queued"
    )

    fault.unlink()
    assert workflow_host.wait_for_run(run_id)["status"] == "completed"
    assert _status(workflow_host)["claimPassFailure"] is None
    assert "claim pass failing" not in workflow_host.cli("host", "status").stdout
