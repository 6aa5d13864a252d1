"""`run why`: the one fact that holds a run, for every reason a run can be held (SPEC §13),
through a real host and real workers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pi_workflows.client.session_client import SessionClient
from pi_workflows.testing import installed_entry_points, short_temp_dir
from tests.decisions.conftest import decision_workflow
from tests.polling import process_gone

from .conftest import HostHarness, wait_until
from .workflows import BLOCKER, CHECKPOINTED, CRASHY

FAILS = """
from pi_workflows import compute, workflow


def explode(ctx):
    raise RuntimeError("the disk is full")


WORKFLOW = workflow(name="fails", start_at="only", nodes={"only": compute(explode)}, edges=[])
"""

# Vetoes every claim: runs stay where they are, so a test can look at them.
NO_CLAIMS_PLUGIN = """
from pi_workflows import hookimpl


@hookimpl
def piw_may_claim(run, host):
    return False
"""

WHY_KEYS = {"runId", "status", "reason", "code", "since", "until", "next"}


def why(harness: HostHarness, run_id: str) -> dict:
    client = harness.client()
    try:
        answer = client.why_run(run_id)
    finally:
        client.close()
    assert set(answer) == WHY_KEYS
    assert answer["runId"] == run_id
    return answer


def test_why_names_what_holds_each_run(harness: HostHarness):
    for name, source in (
        ("blocker", BLOCKER),
        ("checkpointed", CHECKPOINTED),
        ("crashy", CRASHY),
        ("fails", FAILS),
        ("decide", decision_workflow(600_000)),
    ):
        harness.write_workflow(name, source)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1")

    checkpointed = harness.start_run("checkpointed")
    harness.wait_for_status(checkpointed, "waiting")
    answer = why(harness, checkpointed)
    assert answer["code"] == "checkpoint" and answer["status"] == "waiting"
    assert answer["reason"] == "waiting at checkpoint ask"
    assert f"pi-workflows checkpoint answer {checkpointed}" in answer["next"]

    decided = harness.start_run("decide")
    harness.wait_for_status(decided, "waiting")
    answer = why(harness, decided)
    assert answer["code"] == "decision" and answer["until"] > answer["since"]
    assert "(operator) until " in answer["reason"]
    assert answer["reason"].endswith('then the default "stop"')

    session_run = harness.cli(
        "run", "start", "echo", "--session", "chat-7", "--project", str(harness.project)
    ).stdout.strip()
    harness.wait_for_status(session_run, "waiting")
    answer = why(harness, session_run)
    assert answer["code"] == "session"
    assert answer["reason"] == (
        "waiting for session chat-7 to complete step reply (no coordinator is connected)"
    )
    session = SessionClient(harness.home, "chat-7", autostart=False)
    session.open()
    try:
        assert why(harness, session_run)["reason"].endswith("(its coordinator is connected)")
    finally:
        session.close()

    (harness.project / "crash-on-load").touch()
    crashed = harness.start_run("crashy")
    wait_until(
        lambda: harness.client().run_status(crashed)["errorCode"] == "workerNoProgress",
        what="the no-progress park",
    )
    answer = why(harness, crashed)
    assert answer["code"] == "workerNoProgress"
    assert answer["reason"].startswith("parked: workerNoProgress since ")
    assert answer["next"] == f"run 'pi-workflows run resume {crashed}'"

    failed = harness.start_run("fails")
    harness.wait_for_status(failed, "failed")
    answer = why(harness, failed)
    assert answer["code"] == "failed" and "the disk is full" in answer["reason"]
    assert answer["next"] is None

    blocker = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    answer = why(harness, blocker)
    assert answer["code"] == "running" and answer["until"] is not None
    assert answer["reason"].startswith("running node wait (attempt 1) since ")

    first, second, paused = (harness.start_run("hello") for _ in range(3))
    answer = why(harness, second)
    assert answer["code"] == "queued"
    assert answer["reason"] == "queued behind 1 runs; 1 of 1 workers busy"
    harness.cli("run", "pause", paused)
    answer = why(harness, paused)
    assert answer["code"] == "paused" and answer["reason"].startswith("paused by client:")
    assert answer["next"] == f"run 'pi-workflows run resume {paused}'"
    harness.cli("run", "cancel", first)
    assert why(harness, first)["code"] == "cancelled"
    assert why(harness, second)["reason"] == "queued behind 0 runs; 1 of 1 workers busy"

    (harness.project / "release").touch()
    harness.wait_for_status(second, "completed")
    answer = why(harness, second)
    assert answer["code"] == "completed" and answer["reason"].startswith("completed at ")
    assert json.loads(harness.cli("run", "why", decided, "--json").stdout) == why(harness, decided)
    text = harness.cli("run", "why", decided).stdout
    assert text.startswith(f"{decided}: waiting for decision ")
    # The default audience answers in its session or on the command line.
    assert "next: answer it in its run's session ('/workflow answer' in Pi) or with " in text
    assert "'pi-workflows decision answer " in text


@pytest.mark.integration
def test_why_a_parked_run_waits_for_a_claim(harness: HostHarness, tmp_path: Path):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    run_id = harness.start_run("blocker")
    worker = harness.wait_for_pid("blocker.pid")
    harness.stop()  # a clean stop parks the run at its last durable boundary
    assert process_gone(worker)

    (tmp_path / "no_claims.py").write_text(NO_CLAIMS_PLUGIN)
    harness.start_host(
        PI_WORKFLOWS_PLUGINS="no_claims",
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    answer = why(harness, run_id)
    assert answer["code"] == "parked" and answer["status"] == "running"
    assert answer["reason"].startswith("parked at its last durable boundary since ")
    assert answer["next"] == "a host resumes it at its next claim pass"


@pytest.mark.integration
def test_why_a_crashed_hosts_run_waits_for_its_claim_to_be_taken_over(
    harness: HostHarness, tmp_path: Path
):
    harness.write_workflow("blocker", BLOCKER)
    host = harness.start_host()
    run_id = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    old_host_id = harness.query("SELECT owner_id FROM leases WHERE run_id = ?", run_id)[0][0]
    host.kill()
    host.wait()

    (tmp_path / "no_claims.py").write_text(NO_CLAIMS_PLUGIN)
    harness.start_host(
        PI_WORKFLOWS_PLUGINS="no_claims",
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    answer = why(harness, run_id)
    assert answer["code"] == "claimExpired" and answer["until"] is not None
    assert answer["reason"].startswith(
        f"claimed by host {old_host_id} (epoch 1) whose lease expired at "
    )
    assert answer["next"] == "the next claim pass of a live host takes it over"


@pytest.mark.integration
def test_why_a_run_another_live_host_holds_names_that_host_and_its_lease(postgres_url: str):
    owner, other = (
        HostHarness(short_temp_dir(), postgres_url, entry_points=installed_entry_points())
        for _ in range(2)
    )
    try:
        owner.write_workflow("blocker", BLOCKER)
        owner.start_host()
        run_id = owner.start_run("blocker")
        owner.wait_for_pid("blocker.pid")
        owner_id, epoch, expires_at = owner.query(
            "SELECT l.owner_id, h.epoch, l.expires_at FROM leases l "
            "JOIN host_state h ON h.host_id = l.owner_id WHERE l.run_id = ?",
            run_id,
        )[0]
        other.start_host()

        answer = why(other, run_id)
        assert answer["code"] == "claimed" and answer["status"] == "running"
        assert answer["reason"].startswith(
            f"claimed by host {owner_id} (epoch {epoch}) whose lease expires at "
        )
        assert answer["until"] is not None and answer["until"] >= expires_at
        assert answer["next"].startswith("that host runs it; if it dies, another host")
    finally:
        for harness in (owner, other):
            harness.cleanup()
