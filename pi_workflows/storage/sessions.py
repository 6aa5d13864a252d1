"""A session's rows as its view and its branch reports read them: its workflow messages
with their runs, its pending requests, its current run (SPEC §9).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import peewee

from .models import TERMINAL_RUN_STATUSES, HumanDecision, InteractiveRequest, Run, RunQueue
from .models import WorkflowMessage as WorkflowMessage
from .terminal_facts import TERMINAL_QUEUE_STATUSES


def messages_with_runs(session_id: str) -> list[WorkflowMessage]:
    """The session's workflow messages in order, each with its run."""
    return list(
        WorkflowMessage.select(WorkflowMessage, Run)
        .join(Run, on=(Run.run_id == WorkflowMessage.run))
        .where(WorkflowMessage.target_session_id == session_id)
        .order_by(WorkflowMessage.order_number)
    )


def sent_messages_newest_first(session_id: str) -> Iterator[WorkflowMessage]:
    """The session's sent messages, newest first, each with its run, read as they are
    iterated (a caller that stops early reads no more)."""
    yield from (
        WorkflowMessage.select(WorkflowMessage, Run)
        .join(Run, on=(Run.run_id == WorkflowMessage.run))
        .where(
            (WorkflowMessage.target_session_id == session_id) & (WorkflowMessage.status == "sent")
        )
        .order_by(WorkflowMessage.order_number.desc())
    )


def newest_finished_run_message(session_id: str) -> WorkflowMessage | None:
    """The session's newest terminal message of a run that is finished, with its run."""
    message: WorkflowMessage | None = (
        WorkflowMessage.select(WorkflowMessage, Run)
        .join(Run, on=(Run.run_id == WorkflowMessage.run))
        .where(
            (WorkflowMessage.target_session_id == session_id)
            & (WorkflowMessage.kind == "terminal")
            & Run.status.in_(TERMINAL_RUN_STATUSES)
        )
        .order_by(WorkflowMessage.order_number.desc())
        .first()
    )
    return message


def messages_for_source(source_id: str) -> list[WorkflowMessage]:
    """Every workflow message presenting `source_id` (a request, decision or run)."""
    return list(WorkflowMessage.select().where(WorkflowMessage.source_id == source_id))


def unfinished_session_run(session_id: str) -> Run | None:
    """The session's one unfinished run: its newest run whose queue row is not done,
    failed or cancelled (a parent answered by a continuation is done)."""
    run: Run | None = (
        Run.select()
        .join(RunQueue, on=(RunQueue.run == Run.run_id))
        .where(
            (Run.origin_session_id == session_id) & RunQueue.status.not_in(TERMINAL_QUEUE_STATUSES)
        )
        .order_by(Run.created_at.desc())
        .first()
    )
    return run


def source_is_pending(source_id: str) -> bool:
    """Does the interactive request or human decision `source_id` still wait?"""
    request = InteractiveRequest.get_or_none(InteractiveRequest.request_id == source_id)
    if request is not None:
        return request.status == "pending"
    decision = HumanDecision.get_or_none(HumanDecision.decision_id == source_id)
    return decision is not None and decision.status == "pending"


def pending_source_ids(request_ids: set[str], decision_ids: set[str]) -> set[str]:
    """Those of these interactive requests and human decisions that still wait (one query
    for each kind asked about)."""
    pending = set()
    if request_ids:
        pending |= {
            row.request_id
            for row in InteractiveRequest.select(InteractiveRequest.request_id).where(
                InteractiveRequest.request_id.in_(list(request_ids))
                & (InteractiveRequest.status == "pending")
            )
        }
    if decision_ids:
        pending |= {
            row.decision_id
            for row in HumanDecision.select(HumanDecision.decision_id).where(
                HumanDecision.decision_id.in_(list(decision_ids))
                & (HumanDecision.status == "pending")
            )
        }
    return pending


def pending_step_requests(session_id: str) -> list[InteractiveRequest]:
    """The session's pending requests for a step's output (not a decision's)."""
    return list(
        InteractiveRequest.select().where(
            (InteractiveRequest.target_session_id == session_id)
            & (InteractiveRequest.status == "pending")
            & (InteractiveRequest.kind != "decision")
        )
    )


def _pending_requests(session_id: str) -> Any:
    return (
        InteractiveRequest.select()
        .where(
            (InteractiveRequest.target_session_id == session_id)
            & (InteractiveRequest.status == "pending")
        )
        .order_by(InteractiveRequest.created_at, InteractiveRequest.request_id)
    )


def pending_requests(session_id: str, limit: int) -> list[InteractiveRequest]:
    """The session's first `limit` pending requests, oldest first."""
    return list(_pending_requests(session_id).limit(limit))


def pending_request_count(session_id: str) -> int:
    """How many requests of the session are pending."""
    count: int = _pending_requests(session_id).count()
    return count


def is_constraint_violation(error: BaseException | None) -> bool:
    """Is `error` the database refusing a write that breaks a uniqueness or other
    constraint?"""
    return isinstance(error, peewee.IntegrityError)
