"""The worker's end of the worker protocol: numbered messages, fenced responses."""

from __future__ import annotations

import json
import secrets
from typing import IO, Any

from ..canonical import canonical_json
from ..errors import ClaimLostError, PiWorkflowsError, RevisionConflictError
from ..protocol.framing import MAX_WORKER_FRAME_BYTES
from ..protocol.worker_messages import LAUNCH_SCHEMA, MESSAGE_SCHEMA

# A descriptive kind per operation (the host dispatches on the operation).
KIND_FOR_OPERATION = {
    "store.publishUpdate": "node.update",
    "store.reserveEffect": "effect.reserve",
    "store.settleEffect": "effect.settle",
    "store.createHumanDecisionRequest": "interaction.requested",
    "interaction.request": "interaction.requested",
    "interaction.accept": "interaction.accepted",
    "interaction.reject": "interaction.rejected",
    "notification.request": "notification.requested",
    "presentation.request": "presentation.requested",
    "transcript.record": "transcript.recorded",
}


class HostPipe:
    """Sends one message at a time and waits for its response."""

    def __init__(self, envelope: dict[str, Any], reader: IO[bytes], writer: IO[bytes]) -> None:
        self.envelope = envelope
        self.reader = reader
        self.writer = writer
        self.revision = 0

    def call(
        self,
        operation: str,
        payload: dict[str, Any],
        *,
        kind: str | None = None,
        attempt_id: str | None = None,
        control: bool = False,
    ) -> Any:
        message: dict[str, Any] = {
            "schema": MESSAGE_SCHEMA,
            "launchSchema": LAUNCH_SCHEMA,
            "messageId": f"message-{secrets.token_hex(12)}",
            "kind": kind
            or (operation if control else KIND_FOR_OPERATION.get(operation, "worker.progress")),
            "operation": operation,
            "runId": self.envelope["runId"],
            "generation": self.envelope["generation"],
            "workerEpoch": self.envelope["workerEpoch"],
            "expectedRevision": 0 if control else self.revision,
            "payload": payload,
        }
        if attempt_id is not None:
            message["attemptId"] = attempt_id
        self.writer.write(canonical_json(message).encode("utf-8") + b"\n")
        self.writer.flush()
        line = self.reader.readline(MAX_WORKER_FRAME_BYTES + 1)
        if not line:
            raise ClaimLostError("The workflow host closed the worker channel.")
        reply = json.loads(line)
        if isinstance(reply.get("revision"), int):
            self.revision = reply["revision"]
        outcome = reply.get("outcome")
        if outcome == "claimLost":
            raise ClaimLostError(reply.get("error") or "The run's claim was lost.")
        if outcome == "rejected":
            error = reply.get("error") or f"The host rejected {operation}."
            if "revision conflict" in error:
                raise RevisionConflictError(error)
            raise PiWorkflowsError(error)
        return reply.get("result")
