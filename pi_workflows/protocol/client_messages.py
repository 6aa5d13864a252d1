"""The client protocol (`pi-workflows.client.v1`): envelopes, operations, outcomes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..canonical import digest
from ..errors import NotFoundError
from .framing import FrameError, valid_id

SCHEMA = "pi-workflows.client.v1"


REQUEST_KEYS = {
    "schema",
    "type",
    "requestId",
    "clientId",
    "operation",
    "idempotencyKey",
    "payload",
}
OPTIONAL_REQUEST_KEYS = {"runId", "expectedRevision"}


@dataclass(frozen=True)
class ClientRequest:
    request_id: str
    client_id: str
    operation: str
    idempotency_key: str
    payload: dict[str, Any]
    run_id: str | None
    expected_revision: int | None
    raw: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        """Identity of the request for adoption: everything except the request id."""
        return digest({k: v for k, v in self.raw.items() if k != "requestId"})

    def target_run_id(self) -> str:
        """The run the request is about: the envelope's `runId`, else `payload.runId`."""
        run_id = self.run_id or self.payload.get("runId")
        if not valid_id(run_id):
            raise NotFoundError("The request names no run; pass a run id.")
        return run_id


def parse_request(message: dict[str, Any], known_operations: frozenset[str]) -> ClientRequest:
    """Validate a request envelope; a `FrameError` closes the connection."""
    keys = set(message)
    if message.get("schema") != SCHEMA or message.get("type") != "request":
        raise FrameError(f"Expected a {SCHEMA} request")
    missing = REQUEST_KEYS - keys
    unknown = keys - REQUEST_KEYS - OPTIONAL_REQUEST_KEYS
    if missing:
        raise FrameError(f"Request is missing {', '.join(sorted(missing))}")
    if unknown:
        raise FrameError(f"Request has unknown field {sorted(unknown)[0]}")
    for key in ("requestId", "clientId", "idempotencyKey"):
        if not valid_id(message[key]):
            raise FrameError(f"{key} must be a non-empty string of at most 256 bytes")
    operation = message["operation"]
    if operation not in known_operations:
        raise FrameError(f"Unknown operation {str(operation)[:64]!r}")
    if not isinstance(message["payload"], dict):
        raise FrameError("payload must be a JSON object")
    run_id = message.get("runId")
    if run_id is not None and not valid_id(run_id):
        raise FrameError("runId must be a non-empty string of at most 256 bytes")
    expected = message.get("expectedRevision")
    if expected is not None and (type(expected) is not int or expected < 0):
        raise FrameError("expectedRevision must be a non-negative integer")
    return ClientRequest(
        request_id=message["requestId"],
        client_id=message["clientId"],
        operation=operation,
        idempotency_key=message["idempotencyKey"],
        payload=message["payload"],
        run_id=run_id,
        expected_revision=expected,
        raw=message,
    )


def response(
    request_id: str,
    outcome: str,
    *,
    receipt: Any = None,
    error: str | None = None,
    revision: int | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "schema": SCHEMA,
        "type": "response",
        "requestId": request_id,
        "outcome": outcome,
    }
    if receipt is not None:
        message["receipt"] = receipt
    if error is not None:
        message["error"] = error
    if revision is not None:
        message["revision"] = revision
    return message


def refused(error: str) -> dict[str, Any]:
    """Sent instead of a hello when the host cannot take the connection; then it closes."""
    return {"schema": SCHEMA, "type": "refused", "error": error}


def hello(
    connection_id: str, package_version: str, plugin_set: str, settings: dict[str, str]
) -> dict[str, Any]:
    """The host's first message; `plugin_set` lets a client tell its plugins differ, and
    `settings` (a digest of each host-level setting's value) that it asks for other settings."""
    return {
        "schema": SCHEMA,
        "type": "hello",
        "connectionId": connection_id,
        "packageVersion": package_version,
        "pluginSet": plugin_set,
        "settings": settings,
    }
