"""Fenced run claims and the queue transitions built on them (SPEC §6).

Every function here runs inside the caller's transaction (`StateStore.transaction()`),
so a claim check and the write it protects commit together. A claim is identified by
the sha256 of a random token plus a generation that only ever grows.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any, NamedTuple

import peewee
from peewee import SQL, PostgresqlDatabase, fn

from ..canonical import sha256_hex
from ..clock import now_ms
from ..event_types import EventType
from ..records import Claim, RunRecord
from . import effects, known_attempts, run_state, server_plans, statements
from .blobs import put_text
from .deferred_statements import HeldCheck
from .driver import run_sql
from .models import (
    TERMINAL_RUN_STATUSES,
    Effect,
    HumanDecision,
    HumanDecisionResolution,
    InteractiveRequest,
    InteractiveSubmission,
    Lease,
    NodeAttempt,
    Run,
    RunQueue,
    WorkflowMessage,
    WorkflowTurn,
    database_proxy,
)
from .prepared import Parameters, PreparedQuery
from .revisions import (
    NewRun,
    claimed_unchanged,
    created_row,
    created_unchanged,
    note_claimed,
    note_held,
    note_unchanged,
    record_run_change,
)
from .run_poison import LAUNCH_FIELDS, finished_attempts
from .run_state import ACTIVE_ATTEMPT_STATUSES
from .runs import RECORD_COLUMNS, join_record_blobs, record_from_row

RUN_CLAIM_LEASE_MS = 30_000
TERMINAL_QUEUE_STATUSES = ("done", "failed", "cancelled")
# A worker that exited before it committed progress (SPEC §7.4).
NO_PROGRESS_CODE = "workerNoProgress"
NEVER_AUTO_CLAIMED = ("workflowSourceChanged", NO_PROGRESS_CODE, "workerCrashLoop")
MAX_DETAIL_CHARS = 8192


def new_claim_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return sha256_hex(token)


def _pending_interaction(p: Parameters) -> peewee.Function:
    """Does the run wait for its session's answer to an agent step (so only that answer,
    not the claim loop, resumes it)?

    A pending request whose attempt is not recorded as waiting was made just before its
    worker or host died, ahead of the waiting snapshot: claiming that run lets the engine
    record the wait on the same request (it never asks a second time).
    """
    return fn.EXISTS(
        InteractiveRequest.select(SQL("1"))
        .join(NodeAttempt, on=(InteractiveRequest.attempt_id == NodeAttempt.attempt_id))
        .where(
            (InteractiveRequest.run == p.run_id)
            & (InteractiveRequest.status == "pending")
            & (NodeAttempt.status == "waiting")
        )
    )


def _queue_and_lease(p: Parameters) -> peewee.SelectQuery:
    """What a claim decides on, in one read: the queue's status, the lease, whether the
    run waits for its session, and the run's revision; then what its worker's launch
    needs of it (`run_poison.launch_read`) and its record (`claimed_record`)."""
    query = (
        RunQueue.select(
            RunQueue.status,
            Lease.generation,
            Lease.owner_id,
            Lease.expires_at,
            _pending_interaction(p),
            Run.revision,
            *(getattr(Run, name) for name in LAUNCH_FIELDS),
            Run.status,
            finished_attempts(p),
            *RECORD_COLUMNS,
        )
        .join(Lease, on=(Lease.run == RunQueue.run))
        .switch(RunQueue)
        .join(Run, on=(Run.run_id == RunQueue.run))
    )
    query = join_record_blobs(query).where(RunQueue.run == p.run_id)
    # The claim's row (a candidate's is held already, `claim_candidates`) and the run's
    # held until the transaction ends (SQLite's write lock holds them anyway): the
    # compare-and-set on the lease's generation cannot then miss, and the claim's bump
    # need not read the revision back. Locked in the order a claim always took them.
    return query.for_update(of=(Lease, Run)) if database_proxy.obj.for_update else query


_QUEUE_AND_LEASE = PreparedQuery(_queue_and_lease, planned=True)
_TAKE_CLAIM = PreparedQuery(
    lambda p: Lease.update(
        generation=p.generation,
        owner_id=p.owner_id,
        token_hash=p.token_hash,
        acquired_at=p.now,
        heartbeat_at=p.now,
        expires_at=p.expires_at,
    ).where((Lease.run == p.run_id) & (Lease.generation == p.previous_generation)),
    planned=True,
)
_QUEUE_STARTING = PreparedQuery(
    lambda p: RunQueue.update(
        status="starting", error_code=None, error_hash=None, updated_at=p.now
    ).where(RunQueue.run == p.run_id),
    planned=True,
)


def claim_run(
    run_id: str,
    owner_id: str,
    token: str,
    *,
    lease_ms: int = RUN_CLAIM_LEASE_MS,
    allow_pending_interaction: bool = False,
) -> Claim | None:
    """Take the run's claim by compare-and-set on the generation, or return None.

    Inside a transaction the read that decides holds the claim's and the run's rows, so
    the compare-and-set and the claim's bump are held writes: one round trip a claim. A
    run this transaction created and left alone since (a start that claims its run at
    once) is queued at generation 0 with nobody's claim: known without a read, and its
    lease, a row no other transaction can see yet, is taken by a held write."""
    now = now_ms()
    new = created_unchanged(run_id)
    found = _QUEUE_AND_LEASE.first(run_id=run_id) if new is None else None
    if new is None and found is None:
        return None
    queue_status, current_generation, current_owner, expires_at, waits_for_session, revision = (
        ("queued", 0, None, 0, False, None) if found is None else found[:6]
    )
    if queue_status in TERMINAL_QUEUE_STATUSES:
        return None
    if waits_for_session and not allow_pending_interaction:
        return None
    is_live = current_owner is not None and expires_at > now
    if is_live and current_owner != owner_id:
        return None
    generation = current_generation + 1
    take = {
        "run_id": run_id,
        "previous_generation": current_generation,
        "generation": generation,
        "owner_id": owner_id,
        "token_hash": token_hash(token),
        "now": now,
        "expires_at": now + lease_ms,
    }
    if new is not None:
        _TAKE_CLAIM.execute_later(**take)
    elif database_proxy.obj.in_transaction():  # the read holds both rows (see above)
        note_held(run_id, revision)
        _TAKE_CLAIM.execute_later(**take)
    elif _TAKE_CLAIM.changed(**take) != 1:
        return None
    _QUEUE_STARTING.execute_later(run_id=run_id, now=now)
    claimed_revision = record_run_change(
        run_id,
        event_type=EventType.LEASE_CLAIMED,
        actor=f"host:{owner_id}",
        payload={"expiresAt": now + lease_ms},
        lease_generation=generation,
    )
    if new is not None:
        note_unchanged(run_id, new)  # claimed by this transaction: still no worker
        run, progress, row = new, (0, "queued"), created_row(run_id)
    else:
        assert found is not None  # (None only for a run this transaction created)
        run, progress, row = NewRun(*found[6:10]), (found[11], found[10]), found[12:]
    if row is not None:
        # The record as the claim left it (`_QUEUE_STARTING`, the bump).
        record = record_from_row(
            row, queue_status="starting", error_code=None, revision=claimed_revision
        )
        note_claimed(run_id, run, progress, record)
    return Claim(run_id=run_id, owner_id=owner_id, generation=generation, expires_at=now + lease_ms)


def claimed_record(run_id: str) -> RunRecord | None:
    """The record of a run this transaction claimed after reading it (`claim_run`), as
    the claim left it, while nothing else changed the run; else None."""
    claimed = claimed_unchanged(run_id)
    return None if claimed is None else claimed[3]


_LIVE_CLAIM = PreparedQuery(
    lambda p: Lease.select(Lease.generation).where(
        (Lease.run == p.run_id) & (Lease.token_hash == p.token_hash) & (Lease.expires_at > p.now)
    ),
    planned=True,
)
_LIVE_CLAIM_OF_GENERATION = PreparedQuery(
    lambda p: Lease.select(Lease.generation).where(
        (Lease.run == p.run_id)
        & (Lease.token_hash == p.token_hash)
        & (Lease.expires_at > p.now)
        & (Lease.generation == p.generation)
    ),
    planned=True,
)


def live_claim_generation(run_id: str, token: str, generation: int | None = None) -> int | None:
    """The generation of the token's claim while it is the run's live claim, else None."""
    live: int | None
    if generation is None:
        live = _LIVE_CLAIM.scalar(run_id=run_id, token_hash=token_hash(token), now=now_ms())
    else:
        live = _LIVE_CLAIM_OF_GENERATION.scalar(
            run_id=run_id, token_hash=token_hash(token), now=now_ms(), generation=generation
        )
    return live


def _claimed_run(p: Parameters) -> peewee.SelectQuery:
    query = (
        Run.select(Run.revision, Run.status)
        .join(Lease, on=(Lease.run == Run.run_id))
        .where(
            (Run.run_id == p.run_id)
            & (Lease.token_hash == p.token_hash)
            & (Lease.expires_at > p.now)
            & (Lease.generation == p.generation)
        )
    )
    # The run's row held until the transaction ends (SQLite's write lock holds it anyway).
    return query.for_update(of=Run) if database_proxy.obj.for_update else query


_CLAIMED_RUN = PreparedQuery(_claimed_run, planned=True)


def claimed_run(run_id: str, token: str, generation: int) -> tuple[int, str] | None:
    """The run's revision and status while the token's claim of `generation` is live,
    else None. Inside a transaction, the run's row is then held until it ends, so the
    transaction's bumps of the run need not read its revision back (`note_held`)."""
    found = _CLAIMED_RUN.first(
        run_id=run_id, token_hash=token_hash(token), now=now_ms(), generation=generation
    )
    if found is not None:
        note_held(run_id, found[0])
    return found


# `claimed_run` as a check that the run is at an expected revision and status: the count
# of such rows is 1 (its logarithm 0), or 0, whose logarithm fails with a SQLSTATE of its
# own (the host's fence, which travels with it, fails with another). It holds the run's
# row as that read does.
_CHECK_CLAIMED_RUN = (
    "SELECT ln((SELECT count(*) FROM (SELECT 1 FROM runs r JOIN leases l"
    " ON l.run_id = r.run_id WHERE r.run_id = ? AND l.token_hash = ? AND l.expires_at > ?"
    " AND l.generation = ? AND r.revision = ? AND r.status = ? FOR UPDATE OF r) AS held))"
)
_CLAIMED_RUN_CHECK_FAILED = "2201E"  # invalid_argument_for_logarithm


def hold_claimed_run_check(
    run_id: str,
    token: str,
    generation: int,
    expected: tuple[int, str],
    failure: Callable[[], Exception],
) -> bool:
    """PostgreSQL, inside a transaction: `claimed_run` as a check that it would find the
    run at `expected` (revision, status), travelling with the transaction's next
    statement, which raises `failure()` when it does not hold (the claim is not live, or
    the run is elsewhere); from then on the savepoint block it was held in (a write of a
    group commit), or else the transaction, cannot commit. The run's row is held as
    `claimed_run` holds it. False where it cannot travel: the caller reads."""
    revision, status = expected
    params = (run_id, token_hash(token), now_ms(), generation, revision, status)
    check = HeldCheck(failure, _CLAIMED_RUN_CHECK_FAILED, in_block=True)
    if not statements.hold_check(_CHECK_CLAIMED_RUN, params, check):
        return False
    note_held(run_id, revision)
    return True


def verify_claim(run_id: str, token: str, generation: int | None = None) -> bool:
    """True while the token's claim is the run's live claim."""
    return live_claim_generation(run_id, token, generation) is not None


_RENEW_CLAIM = PreparedQuery(
    lambda p: Lease.update(heartbeat_at=p.now, expires_at=p.expires_at).where(
        (Lease.run == p.run_id) & (Lease.token_hash == p.token_hash) & (Lease.expires_at > p.now)
    ),
    planned=True,
)


def renew_claim(run_id: str, token: str, lease_ms: int = RUN_CLAIM_LEASE_MS) -> bool:
    """Extend a live claim; an expired claim can never renew itself (no revision bump)."""
    now = now_ms()
    renewed = _RENEW_CLAIM.changed(
        run_id=run_id, token_hash=token_hash(token), now=now, expires_at=now + lease_ms
    )
    return renewed == 1


_RELEASE_CLAIM = PreparedQuery(
    lambda p: Lease.update(
        owner_id=None, token_hash=None, acquired_at=None, heartbeat_at=None, expires_at=None
    ).where((Lease.run == p.run_id) & (Lease.generation == p.generation)),
    planned=True,
)


_OWN_LIVE_CLAIMS = PreparedQuery(
    lambda p: Lease.select(Lease.run, Lease.generation).where(
        (Lease.owner_id == p.owner_id) & (Lease.expires_at > p.now)
    )
)


def own_live_claims(owner_id: str) -> list[tuple[str, int]]:
    """(run id, generation) of every live claim of this owner."""
    rows = _OWN_LIVE_CLAIMS.rows(owner_id=owner_id, now=now_ms())
    return [(run_id, generation) for run_id, generation in rows]


def release_claim(run_id: str, generation: int) -> bool:
    """Clear the owner of the run's claim of `generation`; False if it has moved on. For a
    claim its owner holds no token of (it never learnt that the claim committed)."""
    released: int = _RELEASE_CLAIM.changed(run_id=run_id, generation=generation)
    return released == 1


def _release(run_id: str, token: str) -> int | None:
    """Clear the owner of a live claim; returns its generation, or None if not ours."""
    generation = live_claim_generation(run_id, token)
    if generation is None:
        return None
    _RELEASE_CLAIM.changed(run_id=run_id, generation=generation)
    return generation


_QUEUE_RUNNING = PreparedQuery(
    lambda p: RunQueue.update(
        status="running", started_at=fn.COALESCE(RunQueue.started_at, p.now), updated_at=p.now
    ).where(RunQueue.run == p.run_id),
    planned=True,
)


def mark_running(run_id: str, token: str, generation: int, *, never_ran: bool = False) -> bool:
    """The queue's `running` for the token's live claim of `generation`; False when that
    claim is not the run's live claim. `never_ran`: the run was `queued` at its claim, so
    it has no node attempts yet, which its first snapshot's write then need not read.

    One read: the claim's check holds the run's row, so the writes that follow (the
    queue's, the revision's) go with the transaction's next statement."""
    if claimed_run(run_id, token, generation) is None:
        return False
    _QUEUE_RUNNING.execute_later(run_id=run_id, now=now_ms())
    revision = record_run_change(
        run_id,
        event_type=EventType.RUN_QUEUE_RUNNING,
        actor="host",
        payload={"status": "running"},
        lease_generation=generation,
    )
    if never_ran:
        known_attempts.note(run_id, revision, {})
    return True


def park_run(
    run_id: str,
    token: str,
    *,
    event_type: EventType = EventType.RUN_QUEUE_PARKED,
    error_code: str | None = None,
    detail: str | None = None,
    to_waiting: bool = False,
) -> bool:
    """Release the claim and park the queue row (the variants of reference §5.5)."""
    generation = _release(run_id, token)
    if generation is None:
        return False
    now = now_ms()
    queue_updates: dict[str, Any] = {"status": "parked", "updated_at": now, "finished_at": None}
    run_updates: dict[str, Any] = {}
    if error_code is not None:
        queue_updates.update(error_code=error_code, available_at=now)
        if detail is not None:
            detail = detail[:MAX_DETAIL_CHARS]
            queue_updates["error_hash"] = put_text(detail)
            run_updates["status_detail"] = detail
    if to_waiting:
        run_updates.update(status="waiting", finished_at=now)
        NodeAttempt.update(status="waiting", finished_at=None).where(
            (NodeAttempt.run == run_id) & NodeAttempt.status.in_(("pending", "running"))
        ).execute()
    RunQueue.update(**queue_updates).where(
        (RunQueue.run == run_id) & RunQueue.status.not_in(TERMINAL_QUEUE_STATUSES)
    ).execute()
    record_run_change(
        run_id,
        event_type=event_type,
        actor="host",
        payload={"status": "parked", "code": error_code},
        lease_generation=generation,
        **run_updates,
    )
    return True


def release_hold(run_id: str) -> None:
    """An operator resumed the run: a code that keeps it from automatic claims (see
    `NEVER_AUTO_CLAIMED`) is cleared, so the claim pass may take it."""
    RunQueue.update(error_code=None, error_hash=None, available_at=now_ms()).where(
        (RunQueue.run == run_id) & RunQueue.error_code.in_(NEVER_AUTO_CLAIMED)
    ).execute()


def park_for_no_progress(run_id: str, token: str, detail: str) -> bool:
    return park_run(
        run_id,
        token,
        event_type=EventType.RUN_WORKER_NO_PROGRESS,
        error_code=NO_PROGRESS_CODE,
        detail=detail,
    )


def park_for_crash_loop(run_id: str, token: str, detail: str) -> bool:
    return park_run(
        run_id,
        token,
        event_type=EventType.RUN_WORKER_CRASH_LOOP,
        error_code="workerCrashLoop",
        detail=detail,
    )


def park_for_source_change(run_id: str, token: str, detail: str) -> bool:
    return park_run(
        run_id,
        token,
        event_type=EventType.RUN_SOURCE_CHANGED,
        error_code="workflowSourceChanged",
        detail=detail,
    )


def park_for_ambiguous_effect(run_id: str, token: str, effect_ids: list[str]) -> bool:
    """Park a run whose effects are in doubt: it waits for an operator (SPEC §7.4a)."""
    return park_run(
        run_id,
        token,
        event_type=EventType.RUN_EFFECT_AMBIGUOUS,
        error_code=effects.AMBIGUOUS_CODE,
        detail=effects.ambiguous_detail(effect_ids),
        to_waiting=True,
    )


_END_OPEN_TURNS = PreparedQuery(
    lambda p: WorkflowTurn.update(state="ended", stop_reason="lost", ended_at=p.now).where(
        (WorkflowTurn.run == p.run_id) & (WorkflowTurn.state == "started")
    ),
    planned=True,
)


def _cancel_pending_messages(kinds: tuple[str, ...]) -> PreparedQuery:
    return PreparedQuery(
        lambda p: WorkflowMessage.update(status="cancelled", updated_at=p.now).where(
            (WorkflowMessage.run == p.run_id)
            & (WorkflowMessage.status == "pending")
            & WorkflowMessage.kind.in_(kinds)
        ),
        planned=True,
    )


# A completed run's follow-ups still reach its session; any other end cancels them too.
_CANCEL_MESSAGES_OF_COMPLETED = _cancel_pending_messages(("step", "decision"))
_CANCEL_MESSAGES = _cancel_pending_messages(("step", "decision", "followUp"))


def settle_open_turns_and_messages(run_id: str, run_status: str) -> None:
    """End open turns as `lost` and cancel pending messages when a run stops (SPEC §7.5).

    Writes whose row counts nothing reads: on PostgreSQL they go with the transaction's
    next statement, as do the queue's and the claim's in `project_lifecycle`."""
    now = now_ms()
    _END_OPEN_TURNS.execute_later(run_id=run_id, now=now)
    cancel = _CANCEL_MESSAGES_OF_COMPLETED if run_status == "completed" else _CANCEL_MESSAGES
    cancel.execute_later(run_id=run_id, now=now)


_RUN_ERROR_HASH = PreparedQuery(
    lambda p: Run.select(Run.error_hash).where(Run.run_id == p.run_id), planned=True
)
_PROJECT_QUEUE = PreparedQuery(
    lambda p: RunQueue.update(
        status=p.status,
        error_code=p.error_code,
        error_hash=p.error_hash,
        updated_at=p.now,
        finished_at=p.finished_at,
    ).where((RunQueue.run == p.run_id) & RunQueue.status.not_in(TERMINAL_QUEUE_STATUSES)),
    planned=True,
)

QUEUE_STATUS_FOR_RUN = {
    "completed": "done",
    "waiting": "parked",
    "cancelled": "cancelled",
    "failed": "failed",
    "timed_out": "failed",
}


def project_lifecycle(run_id: str, generation: int, run_status: str) -> None:
    """Queue and claim follow a snapshot whose status left `running` (SPEC §7.5).

    Runs inside the snapshot's transaction so the run, its queue row and its claim
    never disagree after a commit.
    """
    if run_status == "running":
        return
    now = now_ms()
    if run_status != "waiting":
        settle_open_turns_and_messages(run_id, run_status)
    queue_status = QUEUE_STATUS_FOR_RUN[run_status]
    is_terminal = run_status in TERMINAL_RUN_STATUSES
    _PROJECT_QUEUE.execute_later(
        run_id=run_id,
        status=queue_status,
        error_code=run_status if run_status in ("failed", "timed_out") else None,
        error_hash=_RUN_ERROR_HASH.scalar(run_id=run_id) if queue_status == "failed" else None,
        now=now,
        finished_at=now if is_terminal else None,
    )
    _RELEASE_CLAIM.execute_later(run_id=run_id, generation=generation)


def terminate_run(
    run_id: str,
    token: str | None,
    *,
    status: str,
    code: str,
    error: str,
    status_detail: str | None = None,
) -> bool:
    """End a run as `failed` or `cancelled` from the host (cancel, load failure, …).

    Without a token the run must be unowned (queued, parked or with an expired claim);
    with one, the token must hold the live claim. Cancellation also cancels everything
    that still waits on the run.
    """
    now = now_ms()
    queue = RunQueue.get_or_none(RunQueue.run == run_id)
    if queue is None or queue.status in TERMINAL_QUEUE_STATUSES:
        return False
    lease = Lease.get_by_id(run_id)
    if token is None:
        if lease.is_live(now):
            return False
    elif not verify_claim(run_id, token):
        return False
    # The generation moves on (reference 5.10): whatever held the old claim is fenced out,
    # and no later claim reuses its number.
    Lease.update(
        generation=Lease.generation + 1,
        owner_id=None,
        token_hash=None,
        acquired_at=None,
        heartbeat_at=None,
        expires_at=None,
    ).where(Lease.run == run_id).execute()
    generation = lease.generation + 1
    error_hash = put_text(error)
    RunQueue.update(
        status="cancelled" if status == "cancelled" else "failed",
        error_code=code,
        error_hash=error_hash,
        updated_at=now,
        finished_at=now,
    ).where(RunQueue.run == run_id).execute()
    settle_open_turns_and_messages(run_id, status)
    if status == "cancelled":
        _cancel_dependents(run_id, now, generation)
    record_run_change(
        run_id,
        event_type=(
            EventType.RUN_QUEUE_CANCELLED if status == "cancelled" else EventType.RUN_QUEUE_FAILED
        ),
        actor="host",
        payload={"status": status, "code": code, "error": error},
        lease_generation=generation,
        status=status,
        paused=False,
        status_detail=status_detail,
        error_hash=error_hash,
        finished_at=now,
    )
    return True


def _cancel_dependents(run_id: str, now: int, generation: int) -> None:
    applying = list(Effect.select().where((Effect.run == run_id) & (Effect.status == "applying")))
    # An attempt stopped in the middle of its action was interrupted, not cancelled: the
    # action may have happened (reference 5.9).
    interrupted_nodes = {effects.describe(effect)["nodeId"] for effect in applying}
    open_attempts = (NodeAttempt.run == run_id) & NodeAttempt.status.in_(
        ("pending", "running", "waiting", "interrupted")
    )
    stopped_midway = [
        row.attempt_id
        for row in NodeAttempt.select(NodeAttempt.attempt_id).where(
            (NodeAttempt.run == run_id)
            & NodeAttempt.status.in_(("pending", "running"))
            & NodeAttempt.node_id.in_([node for node in interrupted_nodes if node])
        )
    ]
    for row in NodeAttempt.select().where(
        (NodeAttempt.run == run_id) & NodeAttempt.status.in_(ACTIVE_ATTEMPT_STATUSES)
    ):
        outcome = "interrupted" if row.attempt_id in stopped_midway else "cancelled"
        record = run_state.attempt_record(
            run_id, row.attempt_id, row.node_id, row.node_type, row.started_at
        )
        run_state.note_attempt_finished(record, outcome, now, "The workflow run was cancelled.")
    NodeAttempt.update(status="cancelled", finished_at=now).where(
        open_attempts & NodeAttempt.attempt_id.not_in(stopped_midway)
    ).execute()
    NodeAttempt.update(status="interrupted", finished_at=now).where(
        NodeAttempt.attempt_id.in_(stopped_midway)
    ).execute()
    pending = [
        row.effect_id
        for row in Effect.select(Effect.effect_id).where(
            (Effect.run == run_id) & (Effect.status == "pending")
        )
    ]
    for status, event_type, effect_ids in (
        ("cancelled", EventType.EFFECT_CANCELLED, pending),
        ("ambiguous", EventType.EFFECT_AMBIGUOUS, [e.effect_id for e in applying]),
    ):
        if not effect_ids:
            continue
        Effect.update(status=status, updated_at=now, settled_at=now).where(
            Effect.effect_id.in_(effect_ids)
        ).execute()
        for effect_id in effect_ids:
            record_run_change(
                run_id,
                event_type=event_type,
                actor="host",
                payload={"effectId": effect_id, "runId": run_id, "reason": "workflowCancelled"},
                lease_generation=generation,
            )
    open_decisions = [
        d.decision_id
        for d in HumanDecision.select(HumanDecision.decision_id).where(
            (HumanDecision.run == run_id) & (HumanDecision.status == "pending")
        )
    ]
    for decision_id in open_decisions:
        HumanDecisionResolution.insert(
            decision=decision_id, provenance="cancellation", resolved_at=now
        ).on_conflict_ignore().execute()
    HumanDecision.update(status="cancelled", updated_at=now).where(
        HumanDecision.decision_id.in_(open_decisions)
    ).execute()
    pending_requests = InteractiveRequest.select(InteractiveRequest.request_id).where(
        (InteractiveRequest.run == run_id) & (InteractiveRequest.status == "pending")
    )
    InteractiveSubmission.update(outcome="rejected").where(
        (InteractiveSubmission.request.in_(pending_requests))
        & (InteractiveSubmission.outcome == "validating")
    ).execute()
    InteractiveRequest.update(
        status="cancelled", revision=InteractiveRequest.revision + 1, updated_at=now
    ).where((InteractiveRequest.run == run_id) & (InteractiveRequest.status == "pending")).execute()


DEFAULT_CLAIM_WINDOW = 64

# A candidate's place in claim order, as the built-in selection compares runs
# (builtin/claiming.py): (-priority, available_at, created_at, run_id), so places sort
# as runs are claimed — the highest priority first, then the oldest, then the id. A read
# of candidates `after` a place continues from it (keyset pagination), so a long queue
# is read once, a page at a time.
ClaimPlace = tuple[int, int, int, str]


class Candidate(NamedTuple):
    """A run a claim pass may take, with its revision (a remembered veto names it)."""

    run_id: str
    revision: int
    place: ClaimPlace


# A run whose session owes an agent step's answer is not a candidate (see
# `_pending_interaction`). One branch per queue status, each walking the (status,
# priority DESC, available_at, created_at) index in claim order and stopping after LIMIT
# rows: the cost does not grow with the queue length (the id, the last tie-break, is
# sorted within runs equal on the rest). Raw SQL so the statement is compiled once and
# cached.
_CANDIDATE_BRANCH = """
    SELECT * FROM (
        SELECT -q.priority, q.available_at, q.created_at, q.run_id, r.revision
        FROM run_queue q
        JOIN leases l ON l.run_id = q.run_id
        JOIN runs r ON r.run_id = q.run_id
        WHERE q.status = '{status}' AND q.available_at <= ?
          AND (l.owner_id IS NULL OR l.expires_at <= ?)
          AND (q.error_code IS NULL OR q.error_code NOT IN ({never}))
          AND NOT EXISTS (
              SELECT 1 FROM interactive_requests i
              JOIN node_attempts a ON a.attempt_id = i.attempt_id
              WHERE i.run_id = q.run_id AND i.status = 'pending' AND a.status = 'waiting')
          {extra}
          {after}
        ORDER BY q.priority DESC, q.available_at, q.created_at, {run_id}
        {lock}
        LIMIT ?
    ) AS {status}_{part}
"""

# Behind a place, in two parts, each a range of the index where its walk starts: the
# place's priority from its (available_at, created_at) on, less the runs tied with it up
# to its id; and every lower priority.
_BEHIND_PLACE = {
    "same": """AND q.priority = ? AND (q.available_at, q.created_at) >= (?, ?)
          AND (q.available_at, q.created_at, {run_id}) > (?, ?, ?)""",
    "lower": "AND q.priority < ?",
}


@functools.cache
def _candidate_sql(param: str, *, postgres: bool, locked: bool, after: bool) -> str:
    # Ids compare by code point, as Python sorts them: PostgreSQL's "C" collation (its
    # default follows the server's locale), SQLite's default.
    run_id = 'q.run_id COLLATE "C"' if postgres else "q.run_id"
    parts = _BEHIND_PLACE if after else {"candidates": ""}
    sql = " UNION ALL ".join(
        _CANDIDATE_BRANCH.format(
            status=status,
            part=part,
            extra="AND r.status <> 'waiting' AND r.paused = ?" if status == "parked" else "",
            after=behind.format(run_id=run_id),
            never=", ".join(f"'{code}'" for code in NEVER_AUTO_CLAIMED),
            run_id=run_id,
            # PostgreSQL: lock the candidates' claim rows and skip rows another host's
            # claim transaction holds, so hosts claiming at once walk different
            # candidates instead of racing for the oldest one. The generation
            # compare-and-set of `claim_run` stays the fence; the lock only spares the
            # lost races.
            lock="FOR UPDATE OF l SKIP LOCKED" if postgres and locked else "",
        )
        for status in ("queued", "parked", "starting", "running")
        for part, behind in parts.items()
    )
    return sql.replace("?", param)


def claim_candidates(
    owner_id: str, exclude: set[str], limit: int = DEFAULT_CLAIM_WINDOW
) -> list[str]:
    """Run ids a claim pass may take now, highest priority then oldest first (SPEC §6).

    Runs in `exclude` (active, pending or blocked in this host) are skipped; asking for
    that many more rows keeps `limit` claimable ones in view. On PostgreSQL, call it
    inside the claim's transaction: the candidates stay locked until it ends and
    candidates locked by another host's claim are left out (`SKIP LOCKED`).
    """
    return [candidate.run_id for candidate in _candidates(exclude, limit, locked=True)]


def candidate_revisions(
    exclude: set[str], limit: int, after: ClaimPlace | None = None
) -> list[Candidate]:
    """Like `claim_candidates`, without locks, with each run's revision and place: for a
    pass that asks the claim hooks outside any transaction (the claim itself locks its
    row, `lock_for_claim`). `after`: only candidates behind that place, for a pass that
    goes on from where its last read stopped."""
    return _candidates(exclude, limit, locked=False, after=after)


def _candidates(
    exclude: set[str], limit: int, *, locked: bool, after: ClaimPlace | None = None
) -> list[Candidate]:
    now = now_ms()
    wanted = limit + len(exclude)
    # Parameters of each branch's place condition (`_BEHIND_PLACE`), in its order.
    behind: list[list[Any]] = [[]]
    if after is not None:
        rank, available_at, created_at, run_id = after
        behind = [[-rank, available_at, created_at, available_at, created_at, run_id]]
        behind.append([-rank])
    params: list[Any] = []
    for status in ("queued", "parked", "starting", "running"):
        for place in behind:
            params += [now, now] + ([False] if status == "parked" else []) + place + [wanted]
    database = RunQueue._meta.database.obj  # the open database behind the models' proxy
    sql = _candidate_sql(
        database.param,
        postgres=isinstance(database, PostgresqlDatabase),
        locked=locked,
        after=after is not None,
    )
    # Planned once per connection: planning the four branches costs more than running them.
    rows = server_plans.run(database, sql, params).fetchall()
    # Each row is a place and a revision: sorted, they come in the built-in selection's
    # order (the host takes the first candidate as that selection's answer when nothing
    # else selects).
    ordered = sorted(row for row in rows if row[3] not in exclude)[:limit]
    return [Candidate(row[3], row[4], row[:4]) for row in ordered]


_LOCK_FOR_CLAIM = "SELECT 1 FROM leases WHERE run_id = %s FOR UPDATE SKIP LOCKED"


def lock_for_claim(run_id: str) -> bool:
    """PostgreSQL: lock the run's claim row for this transaction, or False when another
    host's claim transaction holds it (that host is taking the run; skip it, as the
    candidate query's `SKIP LOCKED` does). SQLite's write lock already serialises."""
    database = RunQueue._meta.database.obj
    if not isinstance(database, PostgresqlDatabase):
        return True
    return run_sql(database, _LOCK_FOR_CLAIM, [run_id]).fetchone() is not None
