"""Deadlines of interactive agent steps: only model-turn time counts (SPEC §9.4).

An agent step of an interactive run has no worker while its session works on it, so
the host keeps its deadline in ``node_attempts.deadline_at``. The clock starts when the
step's attempt starts; whenever a step turn starts, the time since the last step turn
ended (or since the attempt started) was idle and moves the deadline forward, and so
does the paused time of a turn that was open when the run was paused. While the session
has no coordinator the clock of a step with an open turn is stopped (event
``interaction.turn_interrupted``); the next coordinator's first branch report starts it
again and gives the stopped time back (``interaction.turn_resumed``). Call everything
inside ``StateStore.transaction()``.
"""

from __future__ import annotations

from typing import Any

import peewee

from ..event_types import EventType
from .blobs import read_json
from .models import (
    Event,
    InteractiveRequest,
    NodeAttempt,
    Run,
    RunQueue,
    WorkflowMessage,
    WorkflowTurn,
)
from .prepared import Parameters, PreparedQuery
from .revisions import record_run_change
from .runs import paused_since
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


def _step_turns(request_id: str | peewee.Field[Any]) -> Any:
    """The turns of a step (`request_id`: a request's id, or its column in a subquery)."""
    return (
        WorkflowTurn.select()
        .join(WorkflowMessage)
        .where((WorkflowMessage.source_id == request_id) & (WorkflowMessage.kind == "step"))
    )


def begin_model_turn(request_id: str, now: int) -> None:
    """A step turn starts: the time since the step was last worked on was idle."""
    request = InteractiveRequest.get_or_none(InteractiveRequest.request_id == request_id)
    if request is None:
        return
    attempt = NodeAttempt.get_or_none(NodeAttempt.attempt_id == request.attempt_id)
    if attempt is None:
        return
    last_end = _step_turns(request_id).select(peewee.fn.MAX(WorkflowTurn.ended_at)).scalar()
    _shift(attempt.attempt_id, now - max(last_end or 0, attempt.started_at))


def give_back_pause(run_id: str, request: InteractiveRequest, now: int) -> None:
    """`run.resume` of a paused step: the paused part of a turn open at pause time is not
    charged (a turn that was not open then is covered by the next turn start)."""
    paused_at = paused_since(run_id)
    if paused_at is None:
        return
    open_at_pause = _step_turns(request.request_id).where(
        (WorkflowTurn.started_at <= paused_at)
        & (WorkflowTurn.ended_at.is_null() | (WorkflowTurn.ended_at > paused_at))
    )
    for turn in open_at_pause:
        _shift(request.attempt_id, min(turn.ended_at or now, now) - paused_at)


def _expired_requests(p: Parameters) -> peewee.BaseQuery:
    open_turn = _step_turns(InteractiveRequest.request_id).where(WorkflowTurn.state == "started")
    return (
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
            & (NodeAttempt.deadline_at <= p.now)
            & RunQueue.status.not_in(TERMINAL_QUEUE_STATUSES)
            & ~Run.paused
            & peewee.fn.EXISTS(open_turn)
        )
        .order_by(NodeAttempt.deadline_at, InteractiveRequest.request_id)
    )


# The host asks at every poll: prepared, because building this query cost more than
# running it on an idle host.
_EXPIRED_REQUESTS = PreparedQuery(_expired_requests)


def expired_requests(now: int) -> list[InteractiveRequest]:
    """Pending agent steps past their deadline on a running, unpaused run with an open
    step turn, oldest deadline first (reference §6.9 `expiredInteractionRuns`)."""
    return _EXPIRED_REQUESTS.models(InteractiveRequest, now=now)


def _open_step_requests(session_id: str | None = None) -> list[InteractiveRequest]:
    """Pending agent steps (of one session) whose model turn is open."""
    query = (
        InteractiveRequest.select(InteractiveRequest)
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
    if session_id is not None:
        query = query.where(InteractiveRequest.target_session_id == session_id)
    return list(query)


def stopped_since(request: InteractiveRequest) -> int | None:
    """When the step's clock stopped for want of a coordinator, if it is stopped now."""
    events = (
        Event.select(Event.event_type, Event.payload_hash, Event.recorded_at)
        .where(
            (Event.run == request.run_id)
            & Event.event_type.in_(
                (EventType.INTERACTION_TURN_INTERRUPTED, EventType.INTERACTION_TURN_RESUMED)
            )
        )
        .order_by(Event.revision.desc())
    )
    for event in events:
        if read_json(event.payload_hash).get("requestId") == request.request_id:
            return (
                event.recorded_at
                if event.event_type == EventType.INTERACTION_TURN_INTERRUPTED
                else None
            )
    return None


def _stop(request: InteractiveRequest) -> None:
    record_run_change(
        request.run_id,
        event_type=EventType.INTERACTION_TURN_INTERRUPTED,
        actor="host",
        payload={"requestId": request.request_id, "attemptId": request.attempt_id},
    )


def stop_session_clocks(session_id: str) -> int:
    """The session lost its coordinator (closed or replaced): its steps with an open model
    turn stop counting (reference 6.9). Returns how many stopped."""
    stopped = [r for r in _open_step_requests(session_id) if stopped_since(r) is None]
    for request in stopped:
        _stop(request)
    return len(stopped)


def restart_session_clocks(session_id: str, now: int) -> int:
    """A new coordinator reported its branch: stopped steps count again, and the stopped
    time moves their deadline (reference 6.10). Returns how many restarted."""
    restarted = 0
    pending = InteractiveRequest.select().where(
        (InteractiveRequest.target_session_id == session_id)
        & (InteractiveRequest.status == "pending")
        & (InteractiveRequest.kind != "decision")
    )
    for request in pending:
        since = stopped_since(request)
        if since is None:
            continue
        _shift(request.attempt_id, now - since)
        record_run_change(
            request.run_id,
            event_type=EventType.INTERACTION_TURN_RESUMED,
            actor="host",
            payload={
                "requestId": request.request_id,
                "attemptId": request.attempt_id,
                "givenBackMs": max(now - since, 0),
            },
        )
        restarted += 1
    return restarted


def give_back_host_downtime(previous_heartbeat_at: int | None, now: int) -> int:
    """A new host starts: steps whose model turn was open while no host ran get that
    time back (nobody could report or submit), and their clocks stay stopped until a
    coordinator reports again. A step whose clock had already stopped gets everything back
    when it restarts. Returns how many steps were shifted."""
    shifted = 0
    for request in _open_step_requests():
        if stopped_since(request) is not None:
            continue
        if previous_heartbeat_at is not None and now > previous_heartbeat_at:
            _shift(request.attempt_id, now - previous_heartbeat_at)
            shifted += 1
        _stop(request)
    return shifted
