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
from ..errors import ConflictError, NotFoundError
from ..records import MessageContent
from .blobs import put_json, read_json
from .models import WorkflowMessage

KINDS = ("step", "decision", "notification", "terminal", "followUp")


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
