"""Workflow turns: which model turn of a session belongs to which workflow message (SPEC §9.4).

A turn starts only on a `sent` message that requests one, at most one turn per message
is open, and an end is recorded once. Every conflict is detected before the insert or
update, so a caller never sees a raw uniqueness-constraint error.
"""

from __future__ import annotations

from typing import Any

from ..errors import NotFoundError, TurnConflictError
from ..records import TurnReport
from .models import WorkflowMessage, WorkflowTurn
from .workflow_messages import TURN_KINDS

TURN_SCHEMA = "pi-workflows.workflow-turn.v1"
STOP_REASONS = ("completed", "aborted", "error", "lost")


def turn_json(turn: WorkflowTurn) -> dict[str, Any]:
    return {
        "schema": TURN_SCHEMA,
        "workflowTurnId": turn.workflow_turn_id,
        "workflowMessageId": turn.workflow_message_id,
        "runId": turn.run_id,
        "targetSessionId": turn.target_session_id,
        "state": turn.state,
        "stopReason": turn.stop_reason,
        "responseSessionEntryId": turn.response_session_entry_id,
        "startedAt": turn.started_at,
        "endedAt": turn.ended_at,
    }


def get_turn(turn_id: str) -> WorkflowTurn | None:
    return WorkflowTurn.get_or_none(WorkflowTurn.workflow_turn_id == turn_id)


def _assert_same_turn(turn: WorkflowTurn, report: TurnReport) -> None:
    if (
        turn.workflow_message_id != report.workflow_message_id
        or turn.run_id != report.run_id
        or turn.target_session_id != report.target_session_id
    ):
        raise TurnConflictError(f"Workflow turn identity conflict: {turn.workflow_turn_id}")


def start_turn(report: TurnReport, now: int) -> WorkflowTurn:
    """Open a turn for a sent message, or return the saved turn of a repeated start.

    `now` is the adjudication's one clock reading, so the turn starts exactly when the
    step deadline it moves says it did.
    """
    existing = get_turn(report.workflow_turn_id)
    if existing is not None:
        _assert_same_turn(existing, report)
        return existing
    message = WorkflowMessage.get_or_none(
        WorkflowMessage.workflow_message_id == report.workflow_message_id
    )
    if message is None:
        raise NotFoundError(f"Workflow message not found: {report.workflow_message_id}")
    if message.run_id != report.run_id or message.target_session_id != report.target_session_id:
        raise TurnConflictError("Workflow turn does not match its message")
    if message.status != "sent":
        raise TurnConflictError("Workflow turn requires a sent message")
    if message.kind not in TURN_KINDS:
        raise TurnConflictError("Workflow message does not request a model turn")
    open_turn = open_turn_for_message(message.workflow_message_id)
    if open_turn is not None:
        raise TurnConflictError(
            f"Workflow message {message.workflow_message_id} already has open turn "
            f"{open_turn.workflow_turn_id}"
        )
    return WorkflowTurn.create(
        workflow_turn_id=report.workflow_turn_id,
        workflow_message=message.workflow_message_id,
        run=report.run_id,
        target_session_id=report.target_session_id,
        state="started",
        started_at=now,
    )


def end_turn(report: TurnReport, now: int) -> tuple[WorkflowTurn, bool]:
    """Record a turn's end at `now`; returns the turn and whether this call ended it.

    A repeated end must carry the saved stop reason and response entry.
    """
    turn = get_turn(report.workflow_turn_id)
    if turn is None:
        raise NotFoundError(f"Workflow turn not found: {report.workflow_turn_id}")
    _assert_same_turn(turn, report)
    if turn.state == "ended":
        if (turn.stop_reason, turn.response_session_entry_id) != (
            report.stop_reason,
            report.response_session_entry_id,
        ):
            raise TurnConflictError("Workflow turn end report conflicts with its saved result")
        return turn, False
    changed = (
        WorkflowTurn.update(
            state="ended",
            stop_reason=report.stop_reason,
            response_session_entry_id=report.response_session_entry_id,
            ended_at=now,
        )
        .where(
            (WorkflowTurn.workflow_turn_id == turn.workflow_turn_id)
            & (WorkflowTurn.state == "started")
        )
        .execute()
    )
    if changed != 1:
        raise TurnConflictError("Workflow turn changed before its end report")
    return WorkflowTurn.get(WorkflowTurn.workflow_turn_id == turn.workflow_turn_id), True


def open_turn_for_message(message_id: str) -> WorkflowTurn | None:
    return WorkflowTurn.get_or_none(
        (WorkflowTurn.workflow_message == message_id) & (WorkflowTurn.state == "started")
    )


def latest_turn_for_message(message_id: str) -> WorkflowTurn | None:
    latest: WorkflowTurn | None = (
        WorkflowTurn.select()
        .where(WorkflowTurn.workflow_message == message_id)
        .order_by(WorkflowTurn.started_at.desc(), WorkflowTurn.workflow_turn_id.desc())
        .first()
    )
    return latest


def open_turns_for_session(session_id: str) -> list[WorkflowTurn]:
    return list(
        WorkflowTurn.select()
        .where((WorkflowTurn.target_session_id == session_id) & (WorkflowTurn.state == "started"))
        .order_by(WorkflowTurn.started_at)
    )
