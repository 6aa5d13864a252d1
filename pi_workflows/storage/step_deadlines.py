"""Deadlines of interactive agent steps: only model-turn time counts (SPEC §9.4).

An agent step of an interactive run has no worker while its session works on it, so
the host keeps its deadline in ``node_attempts.deadline_at``. The clock starts when the
step's attempt starts; whenever a step turn starts, the time since the last step turn
ended (or since the attempt started) was idle and moves the deadline forward, and so
does the paused time of a turn that was open when the run was paused. Call everything
inside ``StateStore.transaction()``.
"""

from __future__ import annotations

from typing import Any

import peewee

from .models import (
    Event,
    InteractiveRequest,
    NodeAttempt,
    Run,
    RunQueue,
    WorkflowMessage,
    WorkflowTurn,
)
from .terminal_facts import TERMINAL_QUEUE_STATUSES


def set_deadline(attempt_id: str, timeout_ms: int | None) -> None:
    """Give a waiting agent attempt its deadline, once (a repeated request keeps it)."""
    if not timeout_ms:
        return
    NodeAttempt.update(deadline_at=NodeAttempt.started_at + timeout_ms).where(
        (NodeAttempt.attempt_id == attempt_id) & NodeAttempt.deadline_at.is_null()
    ).execute()


def _shift(attempt_id: str, by_ms: int) -> None:
    if by_ms > 0:
        NodeAttempt.update(deadline_at=NodeAttempt.deadline_at + by_ms).where(
            (NodeAttempt.attempt_id == attempt_id) & NodeAttempt.deadline_at.is_null(False)
        ).execute()


def _step_turns(request_id: str) -> Any:
    return (
        WorkflowTurn.select()
        .join(WorkflowMessage)
        .where((WorkflowMessage.source_id == request_id) & (WorkflowMessage.kind == "step"))
    )


def begin_model_turn(request_id: str, now: int) -> None:
    """A step turn starts: the time since the step was last worked on was idle."""
    request = InteractiveRequest.get_or_none(InteractiveRequest.request_id == request_id)
    attempt = request and NodeAttempt.get_or_none(NodeAttempt.attempt_id == request.attempt_id)
    if attempt is None:
        return
    last_end = _step_turns(request_id).select(peewee.fn.MAX(WorkflowTurn.ended_at)).scalar()
    _shift(attempt.attempt_id, now - max(last_end or 0, attempt.started_at))


def give_back_pause(run_id: str, request: InteractiveRequest, now: int) -> None:
    """`run.resume` of a paused step: the paused part of a turn open at pause time is not
    charged (a turn that was not open then is covered by the next turn start)."""
    paused_at = (
        Event.select(peewee.fn.MAX(Event.recorded_at))
        .where((Event.run == run_id) & (Event.event_type == "run.paused"))
        .scalar()
    )
    if paused_at is None:
        return
    open_at_pause = _step_turns(request.request_id).where(
        (WorkflowTurn.started_at <= paused_at)
        & (WorkflowTurn.ended_at.is_null() | (WorkflowTurn.ended_at > paused_at))
    )
    for turn in open_at_pause:
        _shift(request.attempt_id, min(turn.ended_at or now, now) - paused_at)


def expired_requests(now: int) -> list[InteractiveRequest]:
    """Pending agent steps past their deadline on a running, unpaused run with an open
    step turn, oldest deadline first (reference §6.9 `expiredInteractionRuns`)."""
    open_turn = _step_turns(InteractiveRequest.request_id).where(WorkflowTurn.state == "started")
    return list(
        InteractiveRequest.select(InteractiveRequest)
        .join(NodeAttempt, on=(NodeAttempt.attempt_id == InteractiveRequest.attempt_id))
        .switch(InteractiveRequest)
        .join(RunQueue, on=(RunQueue.run == InteractiveRequest.run))
        .switch(InteractiveRequest)
        .join(Run, on=(Run.run_id == InteractiveRequest.run))
        .where(
            (InteractiveRequest.status == "pending")
            & (InteractiveRequest.kind != "decision")
            & NodeAttempt.deadline_at.is_null(False)
            & (NodeAttempt.deadline_at <= now)
            & RunQueue.status.not_in(TERMINAL_QUEUE_STATUSES)
            & ~Run.paused
            & peewee.fn.EXISTS(open_turn)
        )
        .order_by(NodeAttempt.deadline_at, InteractiveRequest.request_id)
    )


def give_back_host_downtime(previous_heartbeat_at: int | None, now: int) -> int:
    """A new host starts: steps whose model turn was open while no host ran get that
    time back (nobody could report or submit). Returns how many steps were shifted."""
    if previous_heartbeat_at is None or now <= previous_heartbeat_at:
        return 0
    open_steps = (
        InteractiveRequest.select(InteractiveRequest.attempt_id)
        .join(WorkflowMessage, on=(WorkflowMessage.source_id == InteractiveRequest.request_id))
        .join(
            WorkflowTurn, on=(WorkflowTurn.workflow_message == WorkflowMessage.workflow_message_id)
        )
        .where(
            (InteractiveRequest.status == "pending")
            & (WorkflowMessage.kind == "step")
            & (WorkflowTurn.state == "started")
        )
        .distinct()
    )
    attempt_ids = [row.attempt_id for row in open_steps]
    for attempt_id in attempt_ids:
        _shift(attempt_id, now - previous_heartbeat_at)
    return len(attempt_ids)
