"""The worker protocol (`pi-workflows.worker-message.v1` / `worker-response.v1`)."""

from __future__ import annotations

from typing import Any

from .framing import FrameError, valid_id

MESSAGE_SCHEMA = "pi-workflows.worker-message.v1"
RESPONSE_SCHEMA = "pi-workflows.worker-response.v1"
LAUNCH_SCHEMA = "pi-workflows.worker-launch.v1"
PROTOCOL_VERSION = 1

CONTROL_OPERATIONS = frozenset({"worker.ready", "worker.exiting"})
STORE_OPERATIONS = frozenset(
    {
        "store.readRunState",
        "store.writeSnapshot",
        "store.publishUpdate",
        "store.reserveEffect",
        "store.settleEffect",
        "store.createHumanDecisionRequest",
        "interaction.request",
        "interaction.accept",
        "interaction.reject",
        "notification.request",
        "presentation.request",
        "transcript.record",
    }
)
# Registration of the process groups a worker starts (SPEC §7.4a): fenced by the claim,
# but not run state, so they neither check nor bump the run revision.
PROCESS_OPERATIONS = frozenset({"process.register", "process.unregister"})
# Several store writes committed as one transaction, in order, each checked as if sent
# alone: payload {"steps": [{"operation", "payload", "kind"}, ...], "exiting"?}. The
# worker's last write carries its goodbye, the payload worker.exiting would have sent
# (`exiting: {"status": ...}`), so the exit costs no message of its own.
BATCH_OPERATION = "store.batch"
MAX_BATCH_STEPS = 16
# worker.ready's answer sent with the launch, before the worker asked (a run that never
# ran): the first frame on the worker's stdin, with this outcome and message id. The
# reply to the worker's worker.ready still follows; the worker reads it before the reply
# to its next message.
PREPARED_OUTCOME = "prepared"
PREPARED_MESSAGE_ID = "worker.ready"
# The host's word that it still holds the worker's run: sent unasked after
# the launch and after every renewal of its lease, with `result: {"fenceAtMs": T}`, the
# wall-clock time (epoch ms) by which the worker must have stopped its node's processes
# unless a newer one came (see host/worker_fence.py, worker/lease_fence.py).
LEASE_OUTCOME = "lease"
LEASE_MESSAGE_ID = "host.lease"
OPERATIONS = CONTROL_OPERATIONS | STORE_OPERATIONS | PROCESS_OPERATIONS | {BATCH_OPERATION}


def validate_message(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("schema") != MESSAGE_SCHEMA:
        raise FrameError(f"Worker message must have schema {MESSAGE_SCHEMA}")
    for key in ("messageId", "runId", "workerEpoch", "operation", "kind"):
        if not valid_id(message.get(key)):
            raise FrameError(f"Worker message {key} must be non-empty text of at most 256 bytes")
    if message["operation"] not in OPERATIONS:
        raise FrameError(f"Unknown worker operation {message['operation'][:64]!r}")
    generation = message.get("generation")
    if type(generation) is not int or generation <= 0:
        raise FrameError("Worker message generation must be a positive integer")
    expected = message.get("expectedRevision")
    if type(expected) is not int or expected < 0:
        raise FrameError("Worker message expectedRevision must be a non-negative integer")
    if "attemptId" in message and not valid_id(message["attemptId"]):
        raise FrameError("Worker message attemptId must be non-empty text")
    if not isinstance(message.get("payload"), dict):
        raise FrameError("Worker message payload must be a JSON object")
    if message["operation"] == BATCH_OPERATION:
        _validate_batch(message["payload"].get("steps"))
        exiting = message["payload"].get("exiting")
        if exiting is not None and not (
            isinstance(exiting, dict) and isinstance(exiting.get("status"), str)
        ):
            raise FrameError("A store.batch's exiting must be an object with a text status")
    return message


def _validate_batch(steps: Any) -> None:
    if not isinstance(steps, list) or not 0 < len(steps) <= MAX_BATCH_STEPS:
        raise FrameError(f"A store.batch needs 1 to {MAX_BATCH_STEPS} steps")
    for step in steps:
        if (
            not isinstance(step, dict)
            or step.get("operation") not in STORE_OPERATIONS - {"store.readRunState"}
            or not isinstance(step.get("payload"), dict)
        ):
            raise FrameError("Each store.batch step needs a store write operation and a payload")


def worker_response(
    message_id: str,
    outcome: str,
    *,
    result: Any = None,
    error: str | None = None,
    revision: int | None = None,
) -> dict[str, Any]:
    reply: dict[str, Any] = {"schema": RESPONSE_SCHEMA, "messageId": message_id, "outcome": outcome}
    if result is not None:
        reply["result"] = result
    if error is not None:
        reply["error"] = error
    if revision is not None:
        reply["revision"] = revision
    return reply
