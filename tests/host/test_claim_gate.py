"""Every path that starts a worker goes through one claim gate: capacity, then the claim
hooks, then the fenced claim, then the launch after commit (host/slots.py)."""

from __future__ import annotations

import json

from pi_workflows.client.start_request import start_payload
from pi_workflows.storage import run_claims, run_workers

from .conftest import HostHarness, wait_until
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


# Vetoes runs whose input says so, and notes every run it is asked about.
COUNTING_VETO = """
import json
import os

from pi_workflows import hookimpl


@hookimpl
def piw_may_claim(run, host):
    with open(os.environ["PIW_TEST_ASKED"], "a") as handle:
        handle.write(run.run_id + "\\n")
    return not (isinstance(run.input, dict) and run.input.get("veto"))
"""


def test_a_veto_is_remembered_until_the_run_changes(harness: HostHarness):
    asked = harness.root / "asked"
    harness.add_plugin("counting_veto", COUNTING_VETO)
    harness.write_workflow("blocker", BLOCKER)
    # No poll pass during the test: only the passes after commits ask.
    harness.start_host(
        PI_WORKFLOWS_MAX_WORKERS="2", PI_WORKFLOWS_POLL_S="60", PIW_TEST_ASKED=str(asked)
    )
    blocker = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")

    def times_asked(run_id: str) -> int:
        return asked.read_text().split().count(run_id) if asked.exists() else 0

    vetoed = []
    for _ in range(3):  # each start is a commit, and a claim pass after it
        vetoed.append(harness.start_run("hello", {"veto": True}))
        wait_until(lambda: times_asked(vetoed[-1]) == 1, what="the new run to be asked")
    assert [times_asked(run_id) for run_id in vetoed] == [1, 1, 1]
    why = json.loads(harness.cli("run", "why", vetoed[1], "--json").stdout)
    assert why["reason"] == (
        "queued behind 1 runs; 1 of 2 workers busy; a claim plugin (piw_may_claim) vetoes it"
    )

    # A run that changes (its revision) is asked again; the others are not.
    harness.cli("run", "pause", vetoed[0])
    harness.cli("run", "resume", vetoed[0])
    wait_until(lambda: times_asked(vetoed[0]) == 2, what="the changed run to be asked again")
    assert [times_asked(run_id) for run_id in vetoed[1:]] == [1, 1]
    assert harness.client().run_status(vetoed[0])["status"] == "queued"

    (harness.project / "release").touch()
    harness.wait_for_status(blocker, "completed")


# Vetoes runs whose input says so, slowly while `<project>/slow` exists (a long pass),
# and notes every vetoed run it is asked about.
SLOW_VETO = """
import os
import time
from pathlib import Path

from pi_workflows import hookimpl


@hookimpl
def piw_may_claim(run, host):
    if not (isinstance(run.input, dict) and run.input.get("veto")):
        return True
    if (Path(run.input["project"]) / "slow").exists():
        time.sleep(0.001)
    with open(os.environ["PIW_TEST_ASKED"], "a") as handle:
        handle.write(run.run_id + "\\n")
    return False
"""


def test_a_run_started_while_a_pass_walks_3000_vetoed_runs_is_claimed(harness: HostHarness):
    """A pass over a long queue reads it a page per loop turn, each page from where the
    last one stopped; a run that becomes claimable ahead of that place while the pass
    goes on is taken by the pass that follows it, not left for the poll."""
    asked = harness.root / "asked"
    harness.add_plugin("slow_veto", SLOW_VETO)
    # No poll pass during the test: only the passes after commits look for work.
    harness.start_host(
        PI_WORKFLOWS_MAX_WORKERS="1", PI_WORKFLOWS_POLL_S="60", PIW_TEST_ASKED=str(asked)
    )
    (harness.project / "slow").touch()  # over 3 s for a pass that asks all 3,000
    vetoed = start_payload(
        "hello", harness.project, {"veto": True, "project": str(harness.project)}
    )
    urgent = dict(start_payload("hello", harness.project, {"name": "Ada"}), priority=1)

    def times_asked() -> int:
        return len(asked.read_text().split()) if asked.exists() else 0

    client = harness.client()
    try:
        for _ in range(3):  # one commit each, and a claim pass after it
            client.start_runs([vetoed] * 1000)
        wait_until(lambda: times_asked() > 2000, what="the pass to walk the last runs")
        # First in claim order, ahead of where the pass stands.
        urgent_id = client.start_run(urgent)["runId"]
        assert times_asked() < 3000, "the pass ended before the run was started"
    finally:
        client.close()

    assert harness.wait_for_run(urgent_id)["status"] == "completed"
    (harness.project / "slow").unlink()
    queued = "SELECT COUNT(*) FROM run_queue WHERE status = 'queued'"
    assert harness.query(queued) == [(3000,)]
    assert harness.query("SELECT COUNT(*) FROM run_workers") == [(1,)]


def test_a_pass_asks_for_every_free_slot_in_one_read(harness: HostHarness, monkeypatch):
    """The built-in pass reads as many candidates as the host has free slots: a start on a
    host with four free slots claims its run in one read, which found fewer than it asked
    for and so ends the pass (it used to read again, one candidate at a time)."""
    reads: list[tuple[int, int, int]] = []  # (commits so far, asked for, found)
    read_candidates = run_claims.claim_candidates

    def claim_candidates(owner_id, exclude, limit):
        found = read_candidates(owner_id, exclude, limit)
        reads.append((harness.host.store.commits, limit, len(found)))
        return found

    monkeypatch.setattr(run_claims, "claim_candidates", claim_candidates)
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="4")
    harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")

    claiming = [i for i, (_, _, found) in enumerate(reads) if found]
    assert len(claiming) == 1, reads
    commits, asked, found = reads[claiming[0]]
    assert (asked, found) == (4, 1)
    # Nothing more read in the same transaction.
    assert [read for read in reads[claiming[0] + 1 :] if read[0] == commits] == []
    (harness.project / "release").touch()


def test_a_claim_looks_for_no_never_launched_worker_until_a_commit_may_have_gone_unheard(
    harness: HostHarness, monkeypatch
):
    """A worker row that never launched is left only by a claim whose COMMIT the host never
    heard of (its connection dropped there; `tests/faults/test_commit_outcome_unknown.py`).
    Until the host's connection was lost once, a claim sends nothing to look for one."""
    looked: list[str] = []
    drop_unlaunched = run_workers.drop_unlaunched

    def look(run_id: str, host_epoch: int) -> int:
        looked.append(run_id)
        return drop_unlaunched(run_id, host_epoch)

    monkeypatch.setattr(run_workers, "drop_unlaunched", look)
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1")
    harness.start_run("blocker")
    first = harness.wait_for_pid("blocker.pid")
    # Queued behind the blocker: claimed by a later transaction than its own start's.
    behind = harness.start_run("hello", {"name": "Bea"})
    (harness.project / "release").touch()
    assert harness.wait_for_status(behind, "completed")["status"] == "completed"
    assert looked == []

    store = harness.host.store
    if store.connection_guard is None:
        return  # SQLite: a commit fails or succeeds in this process
    store.connection_guard.ever_lost = True  # (what losing the connection once sets)
    (harness.project / "release").unlink()
    harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid", previous=first)
    again = harness.start_run("hello", {"name": "Cy"})
    (harness.project / "release").touch()
    assert harness.wait_for_status(again, "completed")["status"] == "completed"
    assert looked == [again]
