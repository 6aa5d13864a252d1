"""The `host_commands` rows: a durable client command and its receipt (SPEC §8). Call
`record_receipt` inside the transaction that made the command's change.
"""

from __future__ import annotations

from typing import Any

from ..clock import now_ms
from ..protocol.client_messages import ClientRequest
from . import statements
from .blobs import put_json, put_text
from .models import HostCommand


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
