"""Launches that must not run workflow code: a changed source, a silent worker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.polling import process_gone

from .conftest import HostHarness, wait_until
from .workflows import BLOCKER, SILENT_WORKER_PLUGIN


@pytest.mark.scenario("3.10", "9.9")
def test_a_changed_workflow_source_parks_the_run_until_restored(harness: HostHarness):
    path = harness.write_workflow("blocker", BLOCKER)
    original = path.read_bytes()
    harness.start_host()
    run_id = harness.start_run("blocker")
    worker = harness.wait_for_pid("blocker.pid")
    harness.cli("run", "pause", run_id)
    wait_until(lambda: process_gone(worker), what="the paused worker to stop")

    path.write_bytes(original + b"\n# edited after the run started\n")
    harness.cli("run", "resume", run_id)
    wait_until(
        lambda: harness.client().run_status(run_id)["errorCode"] == "workflowSourceChanged",
        what="the source-change park",
    )
    status = harness.client().run_status(run_id)
    assert status["queueStatus"] == "parked"
    assert "changed since the run was created" in status["statusDetail"]
    why = harness.client().why_run(run_id)
    assert why["code"] == "workflowSourceChanged"
    assert why["reason"].startswith("workflow source changed: ")
    assert f"'pi-workflows run resume {run_id}'" in why["next"]
    # No workflow code ran in the refused worker, and the claim pass leaves the run alone.
    assert harness.wait_for_pid("blocker.pid") == worker
    later = harness.start_run("hello")
    harness.wait_for_status(later, "completed")
    assert len(harness.workers(run_id)) == 2

    path.write_bytes(original)
    harness.cli("run", "resume", run_id)
    harness.wait_for_pid("blocker.pid", previous=worker)
    (harness.project / "release").touch()
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {"released": True}


@pytest.mark.hook_effect("piw_worker_process")
@pytest.mark.scenario("3.6")
def test_a_worker_that_never_says_ready_is_stopped_as_timed_out(
    harness: HostHarness, tmp_path: Path
):
    (tmp_path / "silent_worker.py").write_text(SILENT_WORKER_PLUGIN)
    harness.start_host(
        PI_WORKFLOWS_PLUGINS="silent_worker",
        PI_WORKFLOWS_WORKER_STARTUP_S="1",
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    run_id = harness.start_run("hello")
    silent = harness.wait_for_pid("silent.pid")
    wait_until(
        lambda: harness.client().run_status(run_id)["errorCode"] == "workerNoProgress",
        what="the timed-out launch to be parked",
    )
    assert process_gone(silent)
    assert [w[1] for w in harness.workers(run_id)] == ["timedOut"]
    status = harness.client().run_status(run_id)
    assert status["status"] == "queued" and status["queueStatus"] == "parked"
