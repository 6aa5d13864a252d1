"""The worker protocol (`pi-workflows.worker-message.v1` / `worker-response.v1`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from .framing import FrameError, valid_id

MESSAGE_SCHEMA = "pi-workflows.worker-message.v1"
RESPONSE_SCHEMA = "pi-workflows.worker-response.v1"
LAUNCH_SCHEMA = "pi-workflows.worker-launch.v1"
PROTOCOL_VERSION = 1


class WorkerOperation(StrEnum):
    """What a worker message asks of the host (its ``operation``; the host dispatches
    on it). The engine's run backend has one method per operation (see
    engine.run_backend.OPERATIONS)."""

    # control: the worker's hello and goodbye
    READY = "worker.ready"
    EXITING = "worker.exiting"
    # store reads and writes, checked against the run's revision
    READ_RUN_STATE = "store.readRunState"
    WRITE_SNAPSHOT = "store.writeSnapshot"
    PUBLISH_UPDATE = "store.publishUpdate"
    RESERVE_EFFECT = "store.reserveEffect"
    SETTLE_EFFECT = "store.settleEffect"
    CREATE_HUMAN_DECISION_REQUEST = "store.createHumanDecisionRequest"
    REQUEST_INTERACTION = "interaction.request"
    ACCEPT_INTERACTION = "interaction.accept"
    REJECT_INTERACTION = "interaction.reject"
    REQUEST_NOTIFICATION = "notification.request"
    REQUEST_PRESENTATION = "presentation.request"
    RECORD_TRANSCRIPT = "transcript.record"
    # the process groups a worker starts
    REGISTER_PROCESS = "process.register"
    UNREGISTER_PROCESS = "process.unregister"
    # several store writes in one transaction
    BATCH = "store.batch"


class WorkerKind(StrEnum):
    """What a worker message is about, in the reference's words (its ``kind``): only
    descriptive, for logs and tools; the host dispatches on the operation."""

    READY = "worker.ready"
    EXITING = "worker.exiting"
    PROGRESS = "worker.progress"
    NODE_STARTED = "node.started"
    NODE_UPDATE = "node.update"
    NODE_FINISHED = "node.finished"
    NODE_FAILED = "node.failed"
    RUN_PARKED = "run.parked"
    RUN_FINISHED = "run.finished"
    INTERACTION_REQUESTED = "interaction.requested"
    INTERACTION_ACCEPTED = "interaction.accepted"
    INTERACTION_REJECTED = "interaction.rejected"
    NOTIFICATION_REQUESTED = "notification.requested"
    PRESENTATION_REQUESTED = "presentation.requested"
    TRANSCRIPT_RECORDED = "transcript.recorded"
    EFFECT_RESERVE = "effect.reserve"
    EFFECT_SETTLE = "effect.settle"


CONTROL_OPERATIONS = frozenset({WorkerOperation.READY, WorkerOperation.EXITING})
STORE_OPERATIONS = frozenset(
    {
        WorkerOperation.READ_RUN_STATE,
        WorkerOperation.WRITE_SNAPSHOT,
        WorkerOperation.PUBLISH_UPDATE,
        WorkerOperation.RESERVE_EFFECT,
        WorkerOperation.SETTLE_EFFECT,
        WorkerOperation.CREATE_HUMAN_DECISION_REQUEST,
        WorkerOperation.REQUEST_INTERACTION,
        WorkerOperation.ACCEPT_INTERACTION,
        WorkerOperation.REJECT_INTERACTION,
        WorkerOperation.REQUEST_NOTIFICATION,
        WorkerOperation.REQUEST_PRESENTATION,
        WorkerOperation.RECORD_TRANSCRIPT,
    }
)
# The kind of a store operation's message; a snapshot's depends on its event (the
# worker's host backend), every other operation's is worker.progress.
KIND_FOR_OPERATION = {
    WorkerOperation.PUBLISH_UPDATE: WorkerKind.NODE_UPDATE,
    WorkerOperation.RESERVE_EFFECT: WorkerKind.EFFECT_RESERVE,
    WorkerOperation.SETTLE_EFFECT: WorkerKind.EFFECT_SETTLE,
    WorkerOperation.CREATE_HUMAN_DECISION_REQUEST: WorkerKind.INTERACTION_REQUESTED,
    WorkerOperation.REQUEST_INTERACTION: WorkerKind.INTERACTION_REQUESTED,
    WorkerOperation.ACCEPT_INTERACTION: WorkerKind.INTERACTION_ACCEPTED,
    WorkerOperation.REJECT_INTERACTION: WorkerKind.INTERACTION_REJECTED,
    WorkerOperation.REQUEST_NOTIFICATION: WorkerKind.NOTIFICATION_REQUESTED,
    WorkerOperation.REQUEST_PRESENTATION: WorkerKind.PRESENTATION_REQUESTED,
    WorkerOperation.RECORD_TRANSCRIPT: WorkerKind.TRANSCRIPT_RECORDED,
}


def message_kind(operation: WorkerOperation) -> WorkerKind:
    """The kind of a message that asks `operation` (a snapshot names its own)."""
    if operation in CONTROL_OPERATIONS:
        return WorkerKind(operation)
    return KIND_FOR_OPERATION.get(operation, WorkerKind.PROGRESS)


# Registration of the process groups a worker starts (SPEC §7.4a): fenced by the claim,
# but not run state, so they neither check nor bump the run revision.
PROCESS_OPERATIONS = frozenset(
    {WorkerOperation.REGISTER_PROCESS, WorkerOperation.UNREGISTER_PROCESS}
)
# Several store writes committed as one transaction, in order, each checked as if sent
# alone: payload {"steps": [{"operation", "payload", "kind"}, ...], "exiting"?}. The
# worker's last write carries its goodbye, the payload worker.exiting would have sent
# (`exiting: {"status": ...}`), so the exit costs no message of its own.
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
OPERATIONS = CONTROL_OPERATIONS | STORE_OPERATIONS | PROCESS_OPERATIONS | {WorkerOperation.BATCH}


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
    if message["operation"] == WorkerOperation.BATCH:
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
            or step.get("operation") not in STORE_OPERATIONS - {WorkerOperation.READ_RUN_STATE}
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
