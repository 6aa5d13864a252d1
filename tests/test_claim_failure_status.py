"""Claim plugins that raise or hang: the host goes on without them and names them in
`host status`, `run why` and its log (a real host, plugins named in PI_WORKFLOWS_PLUGINS)."""

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

FAULTY_VETO = """
from pi_workflows import hookimpl


@hookimpl
def piw_may_claim(run, host):
    raise KeyError("tenant")
"""

# Hangs in its first call, for an hour: only the deadline gets the host past it.
HANGING_VETO = """
import time

from pi_workflows import hookimpl


@hookimpl
def piw_may_claim(run, host):
    time.sleep(3600)
"""

BLOCKER = """
import time
from pathlib import Path

from pi_workflows import compute, workflow


def wait(ctx):
    while not (Path.cwd() / "release").exists():
        time.sleep(0.02)
    return {}


WORKFLOW = workflow(name="blocker", start_at="wait", nodes={"wait": compute(wait)}, edges=[])
"""


def _status(host: WorkflowHost) -> dict:
    return json.loads(host.cli("host", "status", "--json").stdout)


def _why(host: WorkflowHost, run_id: str) -> dict:
    return json.loads(host.cli("run", "why", run_id, "--json").stdout)


def test_a_failing_selection_plugin_falls_back_to_the_builtin_and_is_named(
    workflow_host: WorkflowHost,
):
    fault = workflow_host.root / "fault"
    fault.touch()
    workflow_host.add_plugin("piw_faulty_claiming", FAULTY_CLAIMING)
    workflow_host.start(CLAIM_FAULT=str(fault))

    run_id = workflow_host.start_run("hello", {"name": "Ada"})
    # The built-in selection claims it all the same.
    assert workflow_host.wait_for_run(run_id)["status"] == "completed"
    failure = (
        "Plugin 'piw_faulty_claiming' failed in hook piw_select_run_to_claim: "
        "RuntimeError: the priority table is unreadable"
    )
    assert _status(workflow_host)["claimPassFailure"] == failure
    assert f"claim pass failing: {failure}" in workflow_host.cli("host", "status").stdout
    assert workflow_host.host_log().count(failure) == 1  # said once, not every pass

    fault.unlink()
    later = workflow_host.start_run("hello", {"name": "Bea"})
    assert workflow_host.wait_for_run(later)["status"] == "completed"
    assert _status(workflow_host)["claimPassFailure"] is None
    assert "claim pass failing" not in workflow_host.cli("host", "status").stdout


def test_a_raising_veto_is_left_out_and_named_in_run_why(workflow_host: WorkflowHost):
    workflow_host.add_plugin("piw_faulty_veto", FAULTY_VETO)
    workflow_host.write_workflow("blocker", BLOCKER)
    workflow_host.start(PI_WORKFLOWS_MAX_WORKERS="1")

    blocker = workflow_host.start_run("blocker")
    workflow_host.wait_for_status(blocker, "running")
    queued = workflow_host.start_run("hello", {"name": "Ada"})
    failure = "Plugin 'piw_faulty_veto' failed in hook piw_may_claim: KeyError: 'tenant'"
    assert _why(workflow_host, queued)["reason"] == (
        f"queued behind 0 runs; 1 of 1 workers busy; {failure}"
    )
    assert _status(workflow_host)["claimPassFailure"] == failure
    assert failure in workflow_host.host_log()

    (workflow_host.project / "release").touch()
    assert workflow_host.wait_for_run(queued)["status"] == "completed"


def test_a_hanging_veto_costs_one_deadline_and_the_host_goes_on(workflow_host: WorkflowHost):
    workflow_host.add_plugin("piw_hanging_veto", HANGING_VETO)
    workflow_host.write_workflow("blocker", BLOCKER)
    workflow_host.start(PI_WORKFLOWS_MAX_WORKERS="1", PI_WORKFLOWS_HOOK_TIMEOUT_MS="300")

    blocker = workflow_host.start_run("blocker")
    workflow_host.wait_for_status(blocker, "running")
    queued = workflow_host.start_run("hello", {"name": "Ada"})
    hang = (
        "Plugin 'piw_hanging_veto' did not answer hook piw_may_claim within 300 ms "
        "(PI_WORKFLOWS_HOOK_TIMEOUT_MS); the host goes on without it until that call returns"
    )
    assert _status(workflow_host)["claimPassFailure"] == hang
    assert _why(workflow_host, queued)["reason"].endswith(f"1 of 1 workers busy; {hang}")
    assert hang in workflow_host.host_log()

    (workflow_host.project / "release").touch()
    assert workflow_host.wait_for_run(queued)["status"] == "completed"
    # The plugin's thread still sleeps; the host stops all the same.
    workflow_host.cli("host", "stop")
    wait_until(lambda: workflow_host.host_process.poll() is not None, what="the host to exit")
    assert workflow_host.host_process.returncode == 0
