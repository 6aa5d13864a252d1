"""The client protocol (`pi-workflows.client.v1`): envelopes, operations, outcomes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
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

# What the host sends: each type with its exact keys (reference client-protocol §1.4).
HOST_MESSAGE_KEYS = {
    "response": ({"schema", "type", "requestId", "outcome"}, {"revision", "receipt", "error"}),
    "event": ({"schema", "type", "subscriptionId", "event", "payload"}, {"revision", "runId"}),
    "hello": ({"schema", "type", "connectionId", "packageVersion", "pluginSet", "settings"}, set()),
    "refused": ({"schema", "type", "error"}, set()),
}
OUTCOMES = frozenset(
    {"accepted", "adopted", "rejected", "conflict", "notFound", "claimLost", "unavailable"}
)
EVENTS = frozenset(
    {"session_snapshot", "run_progress", "run_status", "runs_changed", "prune_progress"}
)


class ProgressKind(StrEnum):
    """What one entry of a `run_progress` event tells (its ``kind``)."""

    #: a node attempt began (nodeId, attemptId, nodeType).
    NODE_STARTED = "nodeStarted"
    #: a node attempt ended (nodeId, attemptId, outcome, startedAt, finishedAt,
    #: durationMs, error?).
    NODE_ENDED = "nodeEnded"
    #: an action node published an update (nodeId, type, key, data).
    UPDATE = "update"
    #: the run's trace moved (event: the run event's type).
    RUN = "run"


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


def check_host_message(message: Any) -> dict[str, Any]:
    """`message` if it is a well-formed response, event, hello or refusal; a `FrameError`
    naming the first fault otherwise."""
    if not isinstance(message, dict) or message.get("schema") != SCHEMA:
        raise FrameError(f"Expected a {SCHEMA} message")
    kind = message.get("type")
    if kind not in HOST_MESSAGE_KEYS:
        raise FrameError(f"Expected a client response, event or hello, not {str(kind)[:40]!r}")
    required, optional = HOST_MESSAGE_KEYS[kind]
    keys = set(message)
    if required - keys:
        raise FrameError(f"The {kind} is missing {', '.join(sorted(required - keys))}")
    if keys - required - optional:
        raise FrameError(f"Unknown client protocol field: {sorted(keys - required - optional)[0]}")
    error = message.get("error")
    if error is not None and (not isinstance(error, str) or not error):
        raise FrameError(f"The {kind}'s error must be non-empty text")
    revision = message.get("revision")
    if revision is not None and (type(revision) is not int or revision < 0):
        raise FrameError(f"The {kind}'s revision must be a non-negative integer")
    if kind == "response":
        if not valid_id(message["requestId"]):
            raise FrameError("The response's requestId must be a non-empty id")
        if message["outcome"] not in OUTCOMES:
            raise FrameError(f"Unknown response outcome {str(message['outcome'])[:40]!r}")
    elif kind == "event":
        if not valid_id(message["subscriptionId"]):
            raise FrameError("The event's subscriptionId must be a non-empty id")
        if message["event"] not in EVENTS:
            raise FrameError(f"Unknown event {str(message['event'])[:40]!r}")
        if "runId" in message and not valid_id(message["runId"]):
            raise FrameError("The event's runId must be a non-empty id")
    elif kind == "hello":
        for key in ("connectionId", "packageVersion", "pluginSet"):
            if not valid_id(message[key]):
                raise FrameError(f"The hello's {key} must be non-empty text")
        if not isinstance(message["settings"], dict):
            raise FrameError("The hello's settings must be an object")
    return message
