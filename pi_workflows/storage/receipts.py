"""The `host_commands` rows: a durable client command and its receipt (SPEC §8). Call
`record_receipt` inside the transaction that made the command's change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..clock import now_ms
from ..protocol.client_messages import ClientRequest
from . import statements
from .blobs import put_json, put_text
from .deferred_statements import HeldCheck
from .models import HostCommand

# `statements.stored_commands` as a check that it finds nothing: the negated count has a
# square root only for 0, and fails for any other with a SQLSTATE of its own (the host's
# fence and a worker's claim check, which may travel with it, fail with others).
_CHECK_NOTHING_STORED = (
    "SELECT sqrt(-(SELECT count(*) FROM host_commands"
    " WHERE request_id = ? OR (client_id = ? AND idempotency_key = ?)))"
)
_STORED_COMMAND_FOUND = "2201F"  # invalid_argument_for_power_function


def hold_nothing_stored_check(request: ClientRequest, failure: Callable[[], Exception]) -> bool:
    """PostgreSQL, inside a transaction: that no command is stored for `request` (by its
    id, or by its client's idempotency key), as a check travelling with the transaction's
    next statement, which raises `failure()` when one is; from then on the savepoint
    block it was held in (a start of a group commit), or else the transaction, cannot
    commit. False where it cannot travel: the caller reads (`stored_commands`)."""
    params = (request.request_id, request.client_id, request.idempotency_key)
    check = HeldCheck(failure, _STORED_COMMAND_FOUND, in_block=True)
    return statements.hold_check(_CHECK_NOTHING_STORED, params, check)


def record_receipt(
    request: ClientRequest,
    *,
    run_id: str | None,
    accepted_revision: int | None,
    outcome: str,
    receipt: Any,
    error: str | None,
    host_epoch: int,
) -> None:
    """Store a completed request with its receipt and error (each None when it has none)."""
    stamp = now_ms()
    statements.insert_row(
        HostCommand,
        {
            "request_id": request.request_id,
            "client_id": request.client_id,
            "operation": request.operation,
            "idempotency_key": request.idempotency_key,
            "request_fingerprint": request.fingerprint,
            "run_id": run_id,
            "accepted_revision": accepted_revision,
            "outcome": outcome,
            "receipt_hash": put_json(receipt) if receipt is not None else None,
            "error_hash": put_text(error) if error is not None else None,
            "host_epoch": host_epoch,
            "created_at": stamp,
            "completed_at": stamp,
        },
        later=True,  # its failure (a request id stored meanwhile) surfaces in the same block
    )
