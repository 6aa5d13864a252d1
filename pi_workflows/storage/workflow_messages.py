"""The durable, session-addressed outbox of workflow messages (SPEC §9.2).

A message id is derived from its kind, source and idempotency key, so creating the same
message twice adopts the first one; the same id with other content is a conflict.
Order numbers are per session and never reused.
"""

from __future__ import annotations

from typing import Any

from peewee import fn

from ..canonical import digest
from ..clock import now_ms
from ..errors import ConflictError, NotFoundError, TurnConflictError
from ..records import MessageContent
from .blobs import put_json, read_json
from .models import InteractiveRequest, WorkflowMessage

KINDS = ("step", "decision", "notification", "terminal", "followUp")
# Kinds whose message starts a model turn in the session (the others are only shown).
TURN_KINDS = ("step", "terminal", "followUp")
STEP_REASONS = ("initial", "reminder", "resumed")
STEP_MESSAGE_SCHEMA = "pi-workflows.agent-step-message.v1"


def workflow_message_id(kind: str, source_id: str, idempotency_key: str) -> str:
    return "workflow-message-" + digest(
        {"idempotencyKey": idempotency_key, "kind": kind, "sourceId": source_id}
    )


def create_workflow_message(
    *,
    run_id: str,
    target_session_id: str,
    kind: str,
    source_id: str,
    idempotency_key: str,
    content: MessageContent,
) -> tuple[WorkflowMessage, bool]:
    """Create a pending message, or adopt the identical existing one (inside a transaction).

    Returns the message and whether it was created now.
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown workflow message kind {kind!r}")
    message_id = workflow_message_id(kind, source_id, idempotency_key)
    content_hash = put_json({"text": content.text, "details": content.details})
    existing = WorkflowMessage.get_or_none(WorkflowMessage.workflow_message_id == message_id)
    if existing is not None:
        if (
            existing.content_hash != content_hash
            or existing.run_id != run_id
            or existing.target_session_id != target_session_id
        ):
            raise ConflictError(f"Workflow message {message_id} already exists with other content.")
        return existing, False
    last = (
        WorkflowMessage.select(fn.MAX(WorkflowMessage.order_number))
        .where(WorkflowMessage.target_session_id == target_session_id)
        .scalar()
    )
    stamp = now_ms()
    message = WorkflowMessage.create(
        workflow_message_id=message_id,
        run=run_id,
        target_session_id=target_session_id,
        kind=kind,
        source_id=source_id,
        idempotency_key=idempotency_key,
        content_hash=content_hash,
        order_number=(last or 0) + 1,
        status="pending",
        created_at=stamp,
        updated_at=stamp,
    )
    return message, True


def get_workflow_message(message_id: str) -> WorkflowMessage:
    message = WorkflowMessage.get_or_none(WorkflowMessage.workflow_message_id == message_id)
    if message is None:
        raise NotFoundError(f"Workflow message {message_id} does not exist.")
    return message


def message_json(message: WorkflowMessage) -> dict[str, Any]:
    """The `session messages --json` shape of SPEC §13."""
    content = read_json(message.content_hash)
    return {
        "workflowMessageId": message.workflow_message_id,
        "runId": message.run_id,
        "kind": message.kind,
        "status": message.status,
        "order": message.order_number,
        "content": content["text"],
        "details": content["details"],
        "sessionEntryId": message.session_entry_id,
    }


def session_messages(session_id: str) -> list[dict[str, Any]]:
    """Every workflow message of a session, in order."""
    query = (
        WorkflowMessage.select()
        .where(WorkflowMessage.target_session_id == session_id)
        .order_by(WorkflowMessage.order_number)
    )
    return [message_json(message) for message in query]


def cancel_pending_for_source(source_id: str, kind: str | None = None) -> int:
    """`pending → cancelled` for every message of a source (optionally of one kind)."""
    query = WorkflowMessage.update(status="cancelled", updated_at=now_ms()).where(
        (WorkflowMessage.source_id == source_id) & (WorkflowMessage.status == "pending")
    )
    if kind is not None:
        query = query.where(WorkflowMessage.kind == kind)
    cancelled: int = query.execute()
    return cancelled


def step_message_content(
    request: InteractiveRequest, message_id: str, reason: str, preface: str = ""
) -> MessageContent:
    """What the session shows for an agent step: `preface` (a reminder's wording, chosen
    by the turn policy) and the prompt, plus the submit coordinates and, when the node has
    one, its status detail (``presentation.statusDetail``, for the step card)."""
    contract = read_json(request.contract_hash)
    presentation = contract.get("presentation") or {}
    shown = {"presentation": presentation} if presentation.get("statusDetail") else {}
    return MessageContent(
        text=preface + contract["prompt"],
        details={
            "schema": STEP_MESSAGE_SCHEMA,
            "kind": "step",
            "workflowMessageId": message_id,
            "runId": request.run_id,
            "requestId": request.request_id,
            "step": request.node_id,
            "attempt": request.attempt_id,
            "requestRevision": request.revision,
            "reason": reason,
            "contract": contract["contract"],
            **shown,
        },
    )


def ensure_interaction_message(
    request: InteractiveRequest, reason: str, preface: str = ""
) -> WorkflowMessage | None:
    """The step message of an agent request for its current revision and `reason`.

    Keyed by ``"<revision>:<reason>"``, so a repeat adopts; callers bump the request
    revision (and cancel the pending step) before presenting it again.
    """
    if reason not in STEP_REASONS:
        raise ValueError(f"Unknown step message reason {reason!r}")
    if request.target_session_id is None or request.kind == "decision":
        return None
    key = f"{request.revision}:{reason}"
    message_id = workflow_message_id("step", request.request_id, key)
    message, _ = create_workflow_message(
        run_id=request.run_id,
        target_session_id=request.target_session_id,
        kind="step",
        source_id=request.request_id,
        idempotency_key=key,
        content=step_message_content(request, message_id, reason, preface),
    )
    return message


def adopt_branch(session_id: str, entries: list[tuple[str, str]]) -> None:
    """Mark the messages a session's branch shows as `sent` (evidence beats `cancelled`)."""
    for message_id, entry_id in entries:
        message = WorkflowMessage.get_or_none(WorkflowMessage.workflow_message_id == message_id)
        if message is None:
            raise TurnConflictError(
                f"Workflow branch report contains an unknown message: {message_id}"
            )
        if message.target_session_id != session_id:
            raise TurnConflictError("Workflow branch report targets the wrong origin session")
        if message.status == "sent":
            if message.session_entry_id != entry_id:
                raise TurnConflictError("Workflow message has conflicting session entry evidence")
            continue
        WorkflowMessage.update(status="sent", session_entry_id=entry_id, updated_at=now_ms()).where(
            WorkflowMessage.workflow_message_id == message_id
        ).execute()
