"""Resolving a human decision (SPEC §11): exactly one resolution per decision (the
primary key of ``human_decision_resolutions`` is the fence), and the continuation run that
carries an accepted answer, reserved with a deterministic id so every retry adopts. Call
these functions inside ``StateStore.transaction()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peewee import SQL, fn

from ..clock import now_ms
from ..event_types import EventType
from ..records import DecisionResolution
from . import statements
from .blobs import put_json, read_json
from .decision_records import (
    PROVENANCE_CANCELLATION,
    continuation_id_for_decision,
    iso_time,
    resolution_json,
    stored_resolution,
)
from .models import HumanDecision, HumanDecisionResolution, Lease, Run, RunQueue, WorkflowMessage
from .prepared import PreparedQuery, model_instance
from .revisions import record_run_change
from .runs import create_derived_run, paused_since


@dataclass(frozen=True)
class Resolution:
    """The outcome of trying to resolve a decision."""

    won: bool  # this attempt is the winner (or an identical repeat of it: `adopted`)
    adopted: bool
    winner: DecisionResolution
    continuation_run_id: str | None


_SET_DECISION_STATUS = PreparedQuery(
    lambda p: HumanDecision.update(status=p.status, updated_at=p.now).where(
        HumanDecision.decision_id == p.decision_id
    )
)
_SET_CONTINUATION = PreparedQuery(
    lambda p: HumanDecisionResolution.update(continuation_run_id=p.continuation).where(
        HumanDecisionResolution.decision == p.decision_id
    )
)
# A waiting run whose queue row is parked and whose claim nobody holds.
_PARKED_RUN = PreparedQuery(
    lambda p: (
        Run.select()
        .join(RunQueue, on=(RunQueue.run == Run.run_id))
        .join(Lease, on=(Lease.run == Run.run_id))
        .where(
            (Run.run_id == p.run_id)
            & (Run.status == "waiting")
            & (RunQueue.status == "parked")
            & (Lease.owner_id.is_null() | (Lease.expires_at <= p.now))
        )
    )
)
_QUEUE_DONE_FOR_CONTINUATION = PreparedQuery(
    lambda p: RunQueue.update(status="done", updated_at=p.now, finished_at=p.now).where(
        (RunQueue.run == p.run_id) & (RunQueue.status == "parked")
    )
)


def resolve(
    decision: HumanDecision,
    *,
    provenance: str,
    response: dict[str, Any] | None,
    channel: str | None = None,
    actor: str | None = None,
) -> Resolution:
    """Record the one winner of `decision`, or report the earlier winner.

    A repeat of the winning answer from the same source is `adopted`. An accepted answer
    also reserves the continuation run when the parent is parked (otherwise
    :func:`reserve_pending_continuations` does it once the parent parks).
    """
    existing = stored_resolution(decision.decision_id)
    if existing is not None:
        is_repeat = (
            existing.provenance == provenance
            and existing.channel == channel
            and existing.actor == actor
            and read_json(existing.response_hash) == response
        )
        return Resolution(
            is_repeat, is_repeat, resolution_json(existing), existing.continuation_run_id
        )
    stamp = now_ms()
    parent = parked_parent(decision.run_id) if response is not None else None
    continuation = continuation_id_for_decision(decision.decision_id) if parent else None
    # The primary key is the fence: a concurrent second insert fails and rolls back.
    statements.insert_row(
        HumanDecisionResolution,
        {
            "decision": decision.decision_id,
            "provenance": provenance,
            "channel": channel,
            "actor": actor,
            "response_hash": put_json(response) if response is not None else None,
            "continuation_run_id": continuation,
            "resolved_at": stamp,
        },
    )
    status = "cancelled" if provenance == PROVENANCE_CANCELLATION else "accepted"
    _SET_DECISION_STATUS.changed(status=status, now=stamp, decision_id=decision.decision_id)
    record_run_change(
        decision.run_id,
        event_type=(
            EventType.HUMAN_DECISION_CANCELLED
            if status == "cancelled"
            else EventType.HUMAN_DECISION_ACCEPTED
        ),
        actor=f"{provenance}:{channel}" if channel else provenance,
        payload={"decisionId": decision.decision_id, "provenance": provenance},
    )
    cancel_pending_decision_messages(decision.run_id, decision.decision_id)
    if parent is not None and continuation is not None and response is not None:
        _reserve_decision_continuation(parent, decision.decision_id, response, continuation)
    winner: DecisionResolution = {
        "provenance": provenance,
        "channel": channel,
        "actor": actor,
        "response": response,
        "resolvedAt": iso_time(stamp),
        "continuationRunId": continuation,
    }
    return Resolution(True, False, winner, continuation)


def decision_status(winner: DecisionResolution) -> str:
    """The status a decision has once `winner` resolved it."""
    return "cancelled" if winner["provenance"] == PROVENANCE_CANCELLATION else "accepted"


def parked_parent(run_id: str) -> Run | None:
    """The run if it is waiting, its queue row parked and unowned: ready for its
    continuation; else None."""
    row = _PARKED_RUN.first(run_id=run_id, now=now_ms())
    return None if row is None else model_instance(Run, row)


_WINNING_RESPONSE = PreparedQuery(
    lambda p: (
        HumanDecisionResolution.select(
            HumanDecision.decision_id, HumanDecisionResolution.response_hash
        )
        .join(HumanDecision)
        .where(
            (HumanDecision.run == p.run_id)
            & (HumanDecision.node_id == p.node_id)
            & HumanDecisionResolution.response_hash.is_null(False)
        )
        .order_by(HumanDecision.created_at.desc())
        .limit(1)
    )
)


def winning_response(run_id: str, node_id: str) -> dict[str, Any] | None:
    """`{decisionId, response}`: the answer the run's latest decision at `node_id` took."""
    row = _WINNING_RESPONSE.first(run_id=run_id, node_id=node_id)
    if row is None:
        return None
    return {"decisionId": row[0], "response": read_json(row[1])}


def parent_is_parked(run_id: str) -> bool:
    return parked_parent(run_id) is not None


def _reserve_decision_continuation(
    parent: Run, decision_id: str, response: dict[str, Any], run_id: str
) -> None:
    reserve_continuation(
        parent,
        run_id,
        # A decision continuation keeps the parent's input; the answer is the node output.
        input=read_json(parent.input_hash),
        launch_options={"humanDecision": {"decisionId": decision_id, "response": response}},
        actor="decision",
    )


def reserve_continuation(
    parent: Run,
    run_id: str,
    *,
    input: Any,
    launch_options: dict[str, Any],
    actor: str,
) -> tuple[Run, bool]:
    """Create the continuation of a parked parent and retire the parent's queue row.

    The parent's queue row becomes `done`, so it is never resumed or continued twice; a
    retry with the same id adopts the continuation.
    """
    run, created = create_derived_run(
        parent,
        run_id=run_id,
        lineage_kind="continuation",
        input=input,
        actor=actor,
        launch_options=launch_options,
    )
    if created:
        _QUEUE_DONE_FOR_CONTINUATION.changed(run_id=parent.run_id, now=now_ms())
        record_run_change(
            parent.run_id,
            event_type=EventType.RUN_QUEUE_DONE_FOR_CONTINUATION,
            actor=actor,
            payload={"continuationRunId": run_id},
            status_detail=f"Answered; continued by {run_id}",
        )
    return run, created


def _unreserved_continuations() -> Any:
    later = HumanDecision.alias()
    asked_again = later.select(SQL("1")).where(
        (later.run == HumanDecision.run)
        & (later.node_id == HumanDecision.node_id)
        & (later.created_at > HumanDecision.created_at)
    )
    return (
        HumanDecisionResolution.select(HumanDecisionResolution, HumanDecision)
        .join(HumanDecision)
        .join(Run, on=(Run.run_id == HumanDecision.run))
        .where(
            HumanDecisionResolution.continuation_run_id.is_null()
            & HumanDecisionResolution.response_hash.is_null(False)
            # A parent that ended (e.g. cancelled) will never take its continuation.
            & (Run.status == "waiting")
            # An answer to an attempt that died mid-node: the node ran again and asked
            # anew, and the run waits on that request, not this one.
            & ~fn.EXISTS(asked_again)
        )
    )


def supersede_earlier_requests(run_id: str, node_id: str, decision_id: str) -> int:
    """Cancel the pending decisions earlier attempts of `node_id` requested, now that
    `decision_id` asks again; returns how many.

    A worker that dies after its attempt requested a decision, before the run waits, runs
    the node again, and the new attempt requests a decision of its own. Only that one may
    be answered or time out: the run's continuation is checked against it, so an answer to
    the earlier one would continue the run from a request it no longer waits on.
    """
    earlier = list(
        HumanDecision.select().where(
            (HumanDecision.run == run_id)
            & (HumanDecision.node_id == node_id)
            & (HumanDecision.status == "pending")
            & (HumanDecision.decision_id != decision_id)
        )
    )
    for decision in earlier:
        resolve(decision, provenance=PROVENANCE_CANCELLATION, response=None, actor="superseded")
    return len(earlier)


# The host asks at every poll: prepared, because building this query cost more than
# running it on an idle host.
_ANY_UNRESERVED_CONTINUATION = PreparedQuery(
    lambda p: _unreserved_continuations().select(SQL("1")).limit(1)
)


def has_pending_continuations() -> bool:
    return _ANY_UNRESERVED_CONTINUATION.exists()


def reserve_pending_continuations() -> list[str]:
    """Continuations of accepted decisions whose parent was not parked yet at acceptance
    (a parent paused since waits for `run resume`)."""
    reserved = []
    for row in _unreserved_continuations():
        parent = parked_parent(row.decision.run_id)
        if parent is None or parent.paused:
            continue
        decision_id = row.decision.decision_id
        run_id = continuation_id_for_decision(decision_id)
        _reserve_decision_continuation(parent, decision_id, read_json(row.response_hash), run_id)
        _SET_CONTINUATION.changed(continuation=run_id, decision_id=decision_id)
        reserved.append(run_id)
    return reserved


_EXPIRED_DECISIONS = PreparedQuery(
    lambda p: (
        HumanDecision.select(HumanDecision)
        .join(Run, on=(Run.run_id == HumanDecision.run))
        .where(
            (HumanDecision.status == "pending")
            & HumanDecision.deadline_at.is_null(False)
            & (HumanDecision.deadline_at <= p.now)
            & HumanDecision.default_response_hash.is_null(False)
            & ~Run.paused
        )
        .order_by(HumanDecision.deadline_at, HumanDecision.decision_id)
    )
)


def expired_decisions(now: int) -> list[HumanDecision]:
    """Pending decisions with a default whose deadline has passed, oldest deadline first;
    not those of a paused run (their clock is stopped until `run resume`)."""
    return _EXPIRED_DECISIONS.models(HumanDecision, now=now)


def give_back_pause(run_id: str, now: int) -> None:
    """`run resume`: the run's pending decisions get their paused time back on their
    deadlines, so a default never wins for time nobody could answer in."""
    paused_at = paused_since(run_id)
    if paused_at is not None and now > paused_at:
        HumanDecision.update(deadline_at=HumanDecision.deadline_at + (now - paused_at)).where(
            (HumanDecision.run == run_id)
            & (HumanDecision.status == "pending")
            & HumanDecision.deadline_at.is_null(False)
        ).execute()


# By run first: a run's messages are indexed, their source ids are not.
_CANCEL_DECISION_MESSAGES = PreparedQuery(
    lambda p: WorkflowMessage.update(status="cancelled", updated_at=p.now).where(
        (WorkflowMessage.run == p.run_id)
        & (WorkflowMessage.kind == "decision")
        & (WorkflowMessage.source_id == p.decision_id)
        & (WorkflowMessage.status == "pending")
    )
)


def cancel_pending_decision_messages(run_id: str, decision_id: str) -> int:
    """The session's decision message (of the decision's run) is moot once the decision
    is resolved."""
    return _CANCEL_DECISION_MESSAGES.changed(run_id=run_id, decision_id=decision_id, now=now_ms())
