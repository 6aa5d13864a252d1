"""The session view (`pi-workflows.session-view.v1`): what a session should show next.

Computed from the database alone, so every coordinator, watcher and CLI call sees the
same answer; only the coordinator fields depend on who is asking.
"""

from __future__ import annotations

from typing import Any

from .. import settings
from ..bounded_values import quoted
from ..canonical import canonical_json
from ..clock import now_ms
from ..storage import read_json
from ..storage.interactions import InteractiveRequest, is_validating
from ..storage.run_rows import Run
from ..storage.run_statuses import is_terminal_status
from ..storage.runs import run_status
from ..storage.sessions import (
    WorkflowMessage,
    messages_with_runs,
    newest_finished_run_message,
    pending_request_count,
    pending_requests,
    pending_source_ids,
    sent_messages_newest_first,
    source_is_pending,
    unfinished_session_run,
)
from ..storage.turns import latest_turn_for_message, open_turn_for_message, turn_json
from ..storage.workflow_messages import message_json

SESSION_VIEW_SCHEMA = "pi-workflows.session-view.v1"
MAX_PENDING_INTERACTIONS = 256
# A view shows a window of the session's messages — the next one to send, the open one,
# those of pending steps and decisions, then the newest others — so that it always fits
# one protocol frame; `session messages` lists them all.
MAX_VIEW_MESSAGES = 64
VIEW_MESSAGE_BYTES = 512 * 1024
# A pending step's prompt is also its step message's text: the view lists it cut.
PROMPT_MARKER = "[prompt truncated; the step's workflow message carries the whole prompt]"


def pending_interaction_json(request: InteractiveRequest) -> dict[str, Any]:
    contract = read_json(request.contract_hash)
    return {
        "requestId": request.request_id,
        "runId": request.run_id,
        "kind": request.kind,
        "step": request.node_id,
        "attempt": request.attempt_id,
        "revision": request.revision,
        "unproductiveTurnEnds": request.unproductive_turn_ends,
        "validating": is_validating(request.request_id),
        "prompt": quoted(contract.get("prompt"), "prompt", marker=PROMPT_MARKER),
        "contract": contract.get("contract"),
    }


def _eligible(message: WorkflowMessage, run: Run) -> bool:
    """May this pending message be sent now (SPEC §9.1, reference §3.6)?"""
    if message.kind == "step":
        return source_is_pending(message.source_id) and not run.paused
    if message.kind == "decision":
        return source_is_pending(message.source_id)
    if message.kind == "terminal":
        return is_terminal_status(run.status)
    return True


def _is_open(message: WorkflowMessage, run: Run) -> bool:
    """A sent message that still owns the session's next model turn."""
    if message.kind == "step":
        return source_is_pending(message.source_id) and not run.paused
    if message.kind in ("terminal", "followUp"):
        latest = latest_turn_for_message(message.workflow_message_id)
        return latest is None or latest.state == "started"
    return False


def open_message_id(session_id: str) -> str | None:
    """The newest sent message of the session that is still open, if any."""
    for message in sent_messages_newest_first(session_id):
        if _is_open(message, message.run):
            return message.workflow_message_id
    return None


def _retention_ms() -> int:
    """How long a finished run stays the view's `run` after the turn presenting it ended."""
    return settings.integer("terminal_view_ms")


def _retained_run(session_id: str) -> Run | None:
    """A finished run stays while its result is being presented: its terminal message is
    pending, or sent with its turn missing or open, or the turn ended only just now."""
    newest = newest_finished_run_message(session_id)
    if newest is None:
        return None
    if newest.status == "pending":
        return newest.run
    turn = latest_turn_for_message(newest.workflow_message_id)
    if turn is None or turn.ended_at is None or now_ms() - turn.ended_at < _retention_ms():
        return newest.run
    return None


def _current_run(session_id: str) -> Run | None:
    """The view's `run` (reference §5): the unfinished run, else a retained finished one."""
    return unfinished_session_run(session_id) or _retained_run(session_id)


def session_view(session_id: str, coordinator: dict[str, Any] | None) -> dict[str, Any]:
    """The view for one viewer; `coordinator` is ``{epoch, active, branchReported}`` or None."""
    messages = messages_with_runs(session_id)
    next_id = next(
        (m.workflow_message_id for m in messages if m.status == "pending" and _eligible(m, m.run)),
        None,
    )
    may_send = coordinator is None or (coordinator["active"] and coordinator["branchReported"])
    open_id = open_message_id(session_id)
    open_turn = open_turn_for_message(open_id) if open_id else None
    current = _current_run(session_id)
    shown = _message_window(messages, {next_id, open_id})
    return {
        "schema": SESSION_VIEW_SCHEMA,
        "sessionId": session_id,
        "run": _bounded_run(current.run_id) if current is not None else None,
        "pendingInteractions": [
            pending_interaction_json(r)
            for r in pending_requests(session_id, MAX_PENDING_INTERACTIONS)
        ],
        "pendingInteractionTotal": pending_request_count(session_id),
        "workflowMessages": shown,
        "workflowMessageTotal": len(messages),
        "workflowMessagesOmitted": len(messages) - len(shown),
        "nextWorkflowMessageId": next_id if may_send else None,
        "openWorkflowMessageId": open_id,
        "openWorkflowTurn": turn_json(open_turn) if open_turn is not None else None,
        "coordinatorEpoch": coordinator["epoch"] if coordinator else None,
        "coordinatorActive": bool(coordinator and coordinator["active"]),
        "branchReportRequired": bool(
            coordinator and coordinator["active"] and not coordinator["branchReported"]
        ),
    }


def _bounded_run(run_id: str) -> dict[str, Any]:
    """The run's status with a large result or error cut (`run status` has them whole)."""
    status = run_status(run_id)
    status["finalOutput"] = quoted(status["finalOutput"], "result")
    status["error"] = quoted(status["error"], "error")
    return status


def _pending_sources(messages: list[WorkflowMessage]) -> set[str]:
    """Source ids of the step and decision messages whose request still waits (2 queries)."""
    steps = {m.source_id for m in messages if m.kind == "step"}
    decisions = {m.source_id for m in messages if m.kind == "decision"}
    return pending_source_ids(steps, decisions)


def _message_window(messages: list[WorkflowMessage], wanted: set[str | None]) -> list[dict]:
    """The messages a view shows, in order: those in `wanted` and those of pending steps
    and decisions always, then the newest others while they fit the count and byte caps."""
    pending = _pending_sources(messages)
    kept: dict[int, dict[str, Any]] = {}
    for index, message in enumerate(messages):
        if message.workflow_message_id in wanted or message.source_id in pending:
            kept[index] = message_json(message)
    budget = VIEW_MESSAGE_BYTES - sum(_size(m) for m in kept.values())
    for index in range(len(messages) - 1, -1, -1):
        if len(kept) >= MAX_VIEW_MESSAGES:
            break
        if index in kept:
            continue
        shown = message_json(messages[index])
        budget -= _size(shown)
        if budget < 0:
            break
        kept[index] = shown
    return [kept[index] for index in sorted(kept)]


def _size(message: dict[str, Any]) -> int:
    return len(canonical_json(message).encode("utf-8"))
