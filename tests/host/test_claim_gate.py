"""Every path that starts a worker goes through one claim gate: capacity, then the claim
hooks, then the fenced claim, then the launch after commit (host/slots.py)."""

from __future__ import annotations

from .conftest import HostHarness
from .workflows import BLOCKER

VETO = """
from pi_workflows import hookimpl


@hookimpl
def piw_may_claim(run, host):
    return not (isinstance(run.input, dict) and run.input.get("veto"))
"""


def _worker_count(harness: HostHarness, run_id: str) -> int:
    return len(harness.workers(run_id))


def test_resume_waits_for_a_free_worker_slot(harness: HostHarness):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1")
    busy = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    queued = harness.start_run("hello", {"name": "Ada"})
    harness.cli("run", "pause", queued)
    answer = harness.client().resume_run(queued)

    # The only worker slot is taken: the resumed run waits in the queue, unclaimed.
    assert "generation" not in answer
    assert "worker slot" in answer["detail"]
    assert harness.client().run_status(queued)["status"] == "queued"
    assert _worker_count(harness, queued) == 0
    assert harness.query("SELECT COUNT(*) FROM run_workers WHERE status <> 'exited'") == [(1,)]

    (harness.project / "release").touch()
    harness.wait_for_status(busy, "completed")
    assert harness.wait_for_run(queued)["status"] == "completed"


def test_resume_asks_the_claim_veto(harness: HostHarness):
    harness.add_plugin("veto", VETO)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1")
    vetoed = harness.start_run("hello", {"veto": True})
    harness.cli("run", "pause", vetoed)
    harness.client().resume_run(vetoed)
    behind = harness.start_run("hello", {"name": "Bea"})

    # The run behind it is claimed and finishes; the vetoed one never gets a worker.
    assert harness.wait_for_run(behind)["status"] == "completed"
    assert harness.client().run_status(vetoed)["status"] == "queued"
    assert _worker_count(harness, vetoed) == 0
