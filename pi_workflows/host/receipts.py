"""Durable command receipts (`host_commands`): adoption and conflict detection (SPEC §8)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ClaimLostError,
    ConflictError,
    DatabaseUnavailableError,
    NotFoundError,
    PiWorkflowsError,
    RevisionConflictError,
)
from ..protocol.client_messages import ClientRequest, response
from ..protocol.framing import one_line_error
from ..storage import StateStore, read_json, read_text, statements
from ..storage.receipts import record_receipt


class StoredAlready(PiWorkflowsError):
    """A request whose check (`apply_durable` with `held`) found a command stored for it:
    nothing of it was written. Applied again without the check, it is adopted, or is a
    conflict."""


@dataclass
class OperationResult:
    outcome: str
    receipt: Any = None
    error: str | None = None
    revision: int | None = None
    run_id: str | None = None


def _stored_response(row: tuple[Any, ...], request_id: str) -> dict[str, Any]:
    _, stored_outcome, revision, receipt_hash, error_hash = row
    outcome = "adopted" if stored_outcome in ("accepted", "adopted") else stored_outcome
    return response(
        request_id,
        outcome,
        receipt=read_json(receipt_hash),
        error=read_text(error_hash),
        revision=revision,
    )


def adopt(request: ClientRequest) -> dict[str, Any] | None:
    """The answer stored for this request (by id, or by its client's idempotency key), or
    a conflict when the earlier one had another payload; None if there is none."""
    by_id, by_key = statements.stored_commands(
        request.request_id, request.client_id, request.idempotency_key
    )
    if by_id is not None:
        if by_id[0] != request.fingerprint:
            return response(
                request.request_id, "conflict", error="Request ID was reused with another payload"
            )
        return _stored_response(by_id, request.request_id)
    if by_key is not None:
        if by_key[0] != request.fingerprint:
            return response(
                request.request_id,
                "conflict",
                error="Idempotency key was reused with another payload",
            )
        return _stored_response(by_key, request.request_id)
    return None


def execute_durable(
    store: StateStore,
    request: ClientRequest,
    host_epoch: int,
    operation: Callable[[], OperationResult],
) -> dict[str, Any]:
    """Run `operation` and store its receipt in one transaction, or adopt an earlier one.

    If the operation raises, its writes roll back and nothing is recorded, so the
    client may retry the same request.
    """
    adopted = adopt(request)
    if adopted is not None:
        return adopted
    try:
        with store.transaction():
            answer = apply_durable(request, host_epoch, operation)
    except PiWorkflowsError as error:
        return refusal(request, error)
    return answer


def apply_durable(
    request: ClientRequest,
    host_epoch: int,
    operation: Callable[[], OperationResult],
    *,
    held: bool = False,
) -> dict[str, Any]:
    """Inside the caller's transaction: adopt an earlier receipt of the request (also a
    repeat inside the same group commit), or run `operation` and store its receipt. The
    answer, which must not reach the client before that transaction commits.

    `held`: on PostgreSQL, whether an earlier receipt exists is checked with the
    request's next statement instead of read first (a round trip less for the request
    that has none, nearly every one); when one does, the request raises `StoredAlready`
    there, having written nothing, and the caller applies it again without `held`."""
    checked = held and statements.hold_nothing_stored_check(
        request.request_id, request.client_id, request.idempotency_key, StoredAlready
    )
    if not checked:
        adopted = adopt(request)
        if adopted is not None:
            return adopted
    result = operation()
    record_receipt(
        request,
        run_id=result.run_id or request.run_id,
        accepted_revision=result.revision,
        outcome=result.outcome,
        receipt=result.receipt,
        error=result.error,
        host_epoch=host_epoch,
    )
    return _answer(request, result)


def refusal(request: ClientRequest, error: PiWorkflowsError) -> dict[str, Any]:
    """The answer to a request that `error` refused (nothing of it was written)."""
    return response(request.request_id, outcome_for_error(error), error=one_line_error(error))


def _answer(request: ClientRequest, result: OperationResult) -> dict[str, Any]:
    return response(
        request.request_id,
        result.outcome,
        receipt=result.receipt,
        error=result.error,
        revision=result.revision,
    )


def outcome_for_error(error: PiWorkflowsError) -> str:
    """The protocol outcome that matches an error's failure class."""
    if isinstance(error, NotFoundError):
        return "notFound"
    if isinstance(error, (ConflictError, RevisionConflictError)):
        return "conflict"
    if isinstance(error, ClaimLostError):
        return "claimLost"
    if isinstance(error, DatabaseUnavailableError):
        return "unavailable"  # nothing was refused: asking again later may succeed
    return "rejected"
