"""Fenced run claims in the state store: only the live claim moves a run (SPEC §6).

The host's claim paths (terminate, park, renew, complete) are called here the way the host
calls them, inside a transaction, with real leases that really expire.
"""

from __future__ import annotations

import peewee
import pytest

from pi_workflows.clock import now_ms
from pi_workflows.errors import NotFoundError
from pi_workflows.storage import record_run_change, run_claims, run_state, run_workers, statements
from pi_workflows.storage.decision_records import create_request
from pi_workflows.storage.models import Event, Lease, NodeAttempt, Run, RunQueue, RunWorker
from pi_workflows.storage.runs import run_record
from tests.polling import wait_until


def _claim(store, run_id, owner, *, lease_ms=30_000):
    token = run_claims.new_claim_token()
    with store.transaction():
        claim = run_claims.claim_run(run_id, owner, token, lease_ms=lease_ms)
    assert claim is not None, f"{owner} could not claim {run_id}"
    return token, claim


def _expire(claim):
    wait_until(lambda: now_ms() > claim.expires_at, what="the claim's lease to run out")


def _queue(run_id):
    row = RunQueue.get(RunQueue.run == run_id)
    return row.status, row.error_code


def _trail(run_id):
    """What a write would change: the run's revision and status, and its event count."""
    run = Run.get_by_id(run_id)
    return run.revision, run.status, Event.select().where(Event.run == run_id).count()


@pytest.mark.scenario("2.7", "2.22")
def test_a_claim_that_expired_or_passed_on_cannot_end_the_run(store, make_run):
    with store.transaction():
        make_run("run-expired")
        make_run("run-passed")

    # 2.7: the expired claimant's failure is refused; the row stays claimed.
    token, claim = _claim(store, "run-expired", "host-1", lease_ms=50)
    _expire(claim)
    before = _trail("run-expired")
    with store.transaction():
        assert not run_claims.terminate_run(
            "run-expired", token, status="failed", code="workflowLoadFailed", error="late"
        )
    assert _queue("run-expired") == ("starting", None)
    assert _trail("run-expired") == before

    # 2.22: the claim passed from token-a to token-b; token-a's failure writes nothing.
    token_a, claim_a = _claim(store, "run-passed", "host-a", lease_ms=50)
    _expire(claim_a)
    token_b, _ = _claim(store, "run-passed", "host-b")
    with store.transaction():
        assert run_claims.mark_running("run-passed", token_b, claim_a.generation + 1)
    before = _trail("run-passed")
    with store.transaction():
        assert not run_claims.terminate_run(
            "run-passed", token_a, status="failed", code="workerExited", error="stale"
        )
        assert not run_claims.mark_running("run-passed", token_a, claim_a.generation)
    assert _trail("run-passed") == before
    assert _queue("run-passed") == ("running", None)
    assert Lease.get_by_id("run-passed").owner_id == "host-b"


@pytest.mark.scenario("2.8")
def test_only_the_live_generation_parks_a_run_for_an_ambiguous_effect(store, make_run):
    with store.transaction():
        make_run("run-effect")
    old_token, old_claim = _claim(store, "run-effect", "host-1")
    with store.transaction():
        assert run_claims.mark_running("run-effect", old_token, old_claim.generation)
        # Its lease runs out (set, not waited for: a 50 ms lease ran out before mark_running
        # on a loaded machine).
        Lease.update(expires_at=now_ms() - 1).where(Lease.run == "run-effect").execute()

    with store.transaction():
        assert not run_claims.park_for_ambiguous_effect("run-effect", old_token, ["effect-1"])
    assert _queue("run-effect") == ("running", None)

    new_token, new_claim = _claim(store, "run-effect", "host-2")
    assert new_claim.generation == old_claim.generation + 1
    with store.transaction():
        assert not run_claims.park_for_ambiguous_effect("run-effect", old_token, ["effect-1"])
        assert run_claims.park_for_ambiguous_effect("run-effect", new_token, ["effect-1"])
    assert _queue("run-effect") == ("parked", "effectAmbiguous")
    lease = Lease.get_by_id("run-effect")
    assert (lease.owner_id, lease.token_hash, lease.generation) == (None, None, 2)
    run = Run.get_by_id("run-effect")
    assert run.status == "waiting"
    assert run.status_detail.startswith("Effect effect-1 may or may not have happened")


@pytest.mark.scenario("2.9")
def test_park_and_complete_happen_once_per_claim(store, make_run):
    with store.transaction():
        make_run("run-twice")
    first_token, _ = _claim(store, "run-twice", "host-1")
    with store.transaction():
        assert run_claims.park_run("run-twice", first_token)
        assert not run_claims.park_run("run-twice", first_token)  # the park released it
    assert _queue("run-twice") == ("parked", None)

    second_token, second = _claim(store, "run-twice", "host-2")
    with store.transaction():
        assert run_claims.mark_running("run-twice", second_token, second.generation)
        # The completing snapshot: the worker gateway checks the claim, then projects it.
        assert run_claims.claimed_run("run-twice", second_token, second.generation)
        run_claims.project_lifecycle("run-twice", second.generation, "completed")
    assert _queue("run-twice") == ("done", None)

    before = _trail("run-twice")
    with store.transaction():
        # A second completion with the same token finds no claim to write through.
        assert run_claims.claimed_run("run-twice", second_token, second.generation) is None
        assert not run_claims.park_run("run-twice", second_token)
        assert not run_claims.terminate_run(
            "run-twice", second_token, status="failed", code="late", error="late"
        )
        assert not run_claims.park_run("run-twice", first_token)
    assert _queue("run-twice") == ("done", None)
    assert _trail("run-twice") == before


@pytest.mark.scenario("2.13")
def test_only_the_current_lease_renews_or_releases(store, make_run):
    with store.transaction():
        make_run("run-lease")
    token_a, claim_a = _claim(store, "run-lease", "host-a")

    token_b = run_claims.new_claim_token()
    with store.transaction():
        assert run_claims.claim_run("run-lease", "host-b", token_b) is None  # nothing, no error
        assert not run_claims.renew_claim("run-lease", token_b, lease_ms=200)
        before = now_ms()
        assert run_claims.renew_claim("run-lease", token_a, lease_ms=200)
    lease = Lease.get_by_id("run-lease")
    assert before + 200 <= lease.expires_at <= now_ms() + 200
    assert (lease.owner_id, lease.generation) == ("host-a", claim_a.generation)

    with store.transaction():
        assert run_claims.park_run("run-lease", token_a)
        assert not run_claims.park_run("run-lease", token_a)
        assert not run_claims.renew_claim("run-lease", token_a)
    assert Lease.get_by_id("run-lease").owner_id is None


@pytest.mark.scenario("3.2")
def test_a_run_has_one_active_worker_per_generation(store, make_run):
    with store.transaction():
        make_run("run-workers")
    _claim(store, "run-workers", "host-1")
    with store.transaction():
        run_workers.record_worker("worker-1", "run-workers", 1, 1, "0" * 64, 1)
    with pytest.raises(peewee.IntegrityError), store.transaction():
        run_workers.record_worker("worker-2", "run-workers", 1, 1, "0" * 64, 1)

    with store.transaction():
        run_workers.mark_running("worker-1", 4242, "start-identity")
        run_workers.mark_running("worker-1", 4343, "another")  # no longer `starting`: kept
        run_workers.finish_worker("worker-1", "exited", now_ms(), 0, None, None)
        # Once the first has exited, the next generation records its own worker.
        run_workers.record_worker("worker-2", "run-workers", 2, 1, "0" * 64, 2)
    rows = RunWorker.select().where(RunWorker.run == "run-workers").order_by(RunWorker.generation)
    assert [(w.worker_epoch, w.status, w.pid, w.exit_code) for w in rows] == [
        ("worker-1", "exited", 4242, 0),
        ("worker-2", "starting", None, None),
    ]


@pytest.mark.scenario("10.2")
def test_a_decision_request_needs_a_stored_run(store):
    request = {"title": "Ship it?", "choices": {"yes": {"label": "Yes"}}}
    with pytest.raises(NotFoundError, match="Workflow run run-missing does not exist"):
        with store.transaction():
            create_request("run-missing", request)
    assert Event.select().count() == 0


def test_a_run_that_never_ran_writes_its_first_snapshot_without_reading_its_attempts(
    store, make_run, monkeypatch
):
    """`mark_running(never_ran=True)`: a run claimed while `queued` has no node attempts,
    so its first snapshot's write records the new one without asking the database."""
    with store.transaction():
        make_run("run-new")
    token, claim = _claim(store, "run-new", "host-1")
    reads: list[str] = []
    read_attempts = statements.run_attempts
    monkeypatch.setattr(
        statements, "run_attempts", lambda run_id: reads.append(run_id) or read_attempts(run_id)
    )
    with store.transaction():
        assert run_claims.mark_running("run-new", token, claim.generation, never_ran=True)
        run_state.write_snapshot("run-new", _started("run-new", "attempt-1"), _NODE_STARTED)
    assert reads == []
    attempts = NodeAttempt.select(NodeAttempt.attempt_id, NodeAttempt.status).tuples()
    assert list(attempts) == [("attempt-1", "running")]

    # Without the hint (a run that ran before, say), the write reads them.
    with store.transaction():
        make_run("run-resumed")
    token, claim = _claim(store, "run-resumed", "host-1")
    with store.transaction():
        assert run_claims.mark_running("run-resumed", token, claim.generation)
        run_state.write_snapshot("run-resumed", _started("run-resumed", "attempt-2"), _NODE_STARTED)
    assert reads == ["run-resumed"]


_NODE_STARTED = {"type": "node.started"}


def _started(run_id: str, attempt_id: str) -> dict:
    return {
        "schema": run_state.RUN_STATE_SCHEMA,
        "runId": run_id,
        "status": "running",
        "steps": [],
        "currentAttemptId": attempt_id,
        "currentNode": "a",
        "currentNodeType": "compute",
        "currentNodeStartedAt": 1,
    }


def test_a_claim_holds_the_runs_record_as_the_claim_left_it(store, make_run):
    """The claim's read brings the run's record (`claimed_record`), or the transaction
    that created the run knows it: with the queue `starting`, its error cleared and the
    claim's revision, it is what a read after the commit returns, so the launch reads
    nothing."""
    with store.transaction():
        make_run(
            "claimed-record",
            input={"name": "Ada"},
            launch_options={"humanDecision": {"choice": "go"}},
            presentation_prompt="Say what changed.",
            execution_mode="interactive",
            origin_session_id="session-1",
            priority=3,
        )
    with store.transaction():
        RunQueue.update(status="parked", error_code="workerCrashed").where(
            RunQueue.run == "claimed-record"
        ).execute()
    with store.transaction():
        assert run_claims.claim_run("claimed-record", "host-1", run_claims.new_claim_token())
        held = run_claims.claimed_record("claimed-record")
    assert held is not None
    assert held == run_record("claimed-record")
    assert (held.queue_status, held.error_code, held.revision) == ("starting", None, 2)
    assert held.launch_options == {"humanDecision": {"choice": "go"}}
    assert held.presentation_prompt == "Say what changed."
    # A run the transaction created and claimed: the record its creation wrote.
    with store.transaction():
        make_run("claimed-fresh", input={"items": [1, 2]}, presentation_prompt="Tell.")
        assert run_claims.claim_run("claimed-fresh", "host-1", run_claims.new_claim_token())
        fresh = run_claims.claimed_record("claimed-fresh")
    assert fresh is not None and fresh == run_record("claimed-fresh")
    assert (fresh.queue_status, fresh.revision, fresh.input) == ("starting", 2, {"items": [1, 2]})
    # Nothing held once another change touched the run since its claim.
    with store.transaction():
        make_run("claimed-changed")
        assert run_claims.claim_run("claimed-changed", "host-1", run_claims.new_claim_token())
        record_run_change("claimed-changed", event_type="run.started", actor="test")
        assert run_claims.claimed_record("claimed-changed") is None
