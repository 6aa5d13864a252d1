"""Pause, resume and cancel on running, parked and pending runs (real host, workers)."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from pi_workflows.host import supervisor
from tests.polling import process_gone

from .conftest import HostHarness, InProcessHarness, wait_until
from .workflows import BLOCKER


def test_pause_and_resume_a_running_run(harness: HostHarness):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    run_id = harness.start_run("blocker")
    worker = harness.wait_for_pid("blocker.pid")
    receipt = json.loads(harness.cli("run", "pause", run_id, "--json").stdout)
    assert receipt["paused"] is True
    wait_until(lambda: process_gone(worker), what="the paused worker to stop")
    status = harness.client().run_status(run_id)
    assert status["paused"] is True and status["queueStatus"] == "parked"
    again = json.loads(harness.cli("run", "pause", run_id, "--json").stdout)
    assert again["alreadyPaused"] is True

    harness.cli("run", "resume", run_id)
    second = harness.wait_for_pid("blocker.pid", previous=worker)
    assert second != worker
    (harness.project / "release").touch()
    status = harness.wait_for_status(run_id, "completed")
    assert status["paused"] is False
    assert status["finalOutput"] == {"released": True}


def test_cancel_a_running_run_stops_its_worker(harness: HostHarness):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    run_id = harness.start_run("blocker")
    worker = harness.wait_for_pid("blocker.pid")
    harness.cli("run", "cancel", run_id)
    # A repeat while the cancelled worker may still be exiting (the host still holds its
    # slot) is refused as terminal, not reported as a lost claim.
    while_exiting = harness.cli("run", "cancel", run_id, check=False)
    assert while_exiting.returncode == 1 and "already terminal" in while_exiting.stderr
    wait_until(lambda: process_gone(worker), what="the cancelled worker to stop")
    status = harness.client().run_status(run_id)
    assert status["status"] == "cancelled" and status["queueStatus"] == "cancelled"
    assert status["error"] == "Workflow run cancelled"
    repeat = harness.cli("run", "cancel", run_id, check=False)
    assert repeat.returncode == 1 and "already terminal" in repeat.stderr


@pytest.mark.scenario("5.5")
def test_cancel_a_parked_run(harness: HostHarness):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    run_id = harness.start_run("blocker")
    worker = harness.wait_for_pid("blocker.pid")
    harness.cli("run", "pause", run_id)
    wait_until(lambda: process_gone(worker), what="the worker to stop")
    harness.cli("run", "cancel", run_id)
    status = harness.client().run_status(run_id)
    assert status["status"] == "cancelled" and status["paused"] is False


@pytest.mark.scenario("5.7")
def test_pause_resume_and_cancel_pending_runs(harness: HostHarness):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1")
    blocker = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    to_pause = harness.start_run("hello", {"name": "paused"})
    to_cancel = harness.start_run("hello", {"name": "cancelled"})
    later = harness.start_run("hello", {"name": "later"})
    assert harness.client().run_status(to_pause)["queueStatus"] == "queued"

    harness.cli("run", "pause", to_pause)
    # Cancelled before any activation: the receipt is committed, and no claim pass
    # launches it later.
    client = harness.client()
    try:
        assert client.cancel_run(to_cancel) == {"runId": to_cancel, "status": "cancelled"}
    finally:
        client.close()
    assert harness.client().run_status(to_pause)["queueStatus"] == "parked"
    assert harness.client().run_status(to_cancel)["status"] == "cancelled"

    (harness.project / "release").touch()
    harness.wait_for_status(blocker, "completed")
    harness.wait_for_status(later, "completed")
    # The paused run is older than `later` but was skipped by every claim pass.
    assert harness.client().run_status(to_pause)["status"] == "queued"
    assert harness.workers(to_pause) == [] and harness.workers(to_cancel) == []

    harness.cli("run", "resume", to_pause)
    status = harness.wait_for_status(to_pause, "completed")
    assert status["finalOutput"] == {"greeting": "Hello, paused!"}


@pytest.mark.scenario("5.5", "5.11")
def test_cancel_right_after_pause_is_accepted_while_the_worker_still_stops(
    harness: HostHarness,
):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    run_id = harness.start_run("blocker")
    worker = harness.wait_for_pid("blocker.pid")
    client = harness.client()
    try:
        assert client.pause_run(run_id)["paused"] is True
        # The paused worker is still stopping: the run is parked and has no owner.
        receipt = client.cancel_run(run_id)
    finally:
        client.close()
    assert receipt["status"] == "cancelled"
    wait_until(lambda: process_gone(worker), what="the worker to stop")
    status = harness.client().run_status(run_id)
    assert status["status"] == "cancelled" and status["queueStatus"] == "cancelled"
    assert status["paused"] is False


def _how_workers_ended(harness: HostHarness, run_id: str) -> str:
    """For a failure: how the host saw the run's workers end (it failed three times in
    full suites, never alone: the stopped worker was gone before the test was done)."""
    ended = (
        "SELECT generation, status, exit_code, signal FROM run_workers WHERE run_id = ?"
        " ORDER BY generation"
    )
    with contextlib.suppress(AssertionError):  # the message is wanted either way
        wait_until(lambda: harness.query(ended, run_id)[0][1] != "running", timeout=5)
    return (
        "the window closed before the test was done; the run's workers "
        f"(generation, status, exit code, signal): {harness.query(ended, run_id)}"
    )


def test_resume_right_after_pause_runs_the_run_again_once_its_worker_has_stopped(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
):
    # The host runs in this process, so its stop's grace period can be stretched: six
    # requests must fit in it, and on a loaded machine two seconds were not always enough.
    assert isinstance(harness, InProcessHarness)
    monkeypatch.setattr(supervisor, "KILL_GRACE_S", 60.0)
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    run_id = harness.start_run("blocker")
    worker = harness.wait_for_pid("blocker.pid")
    # A stopped worker takes the pause's SIGTERM only when it is continued (or at the
    # SIGKILL after the grace period): until then the run stays "paused, its worker
    # still stopping".
    os.kill(worker, signal.SIGSTOP)
    client = harness.client()
    try:
        assert client.pause_run(run_id)["paused"] is True
        # The resume is not "already running": it holds, and the run runs again.
        resumed = client.resume_run(run_id)
        assert resumed.get("alreadyRunning") is not True and resumed["queued"] is True
        assert client.run_status(run_id)["paused"] is False
        # A pause in the same window pauses it again, and a resume undoes that too.
        assert client.pause_run(run_id)["alreadyPaused"] is False
        assert client.run_status(run_id)["paused"] is True
        assert client.resume_run(run_id)["queued"] is True
        assert not process_gone(worker), _how_workers_ended(harness, run_id)
    finally:
        client.close()
        os.kill(worker, signal.SIGCONT)  # it takes the pause's SIGTERM now
    second = harness.wait_for_pid("blocker.pid", previous=worker)
    assert second != worker and process_gone(worker)
    (harness.project / "release").touch()
    status = harness.wait_for_status(run_id, "completed")
    assert status["paused"] is False and status["finalOutput"] == {"released": True}
