"""The run backend the engine executes against.

Two implementations exist: :class:`~pi_workflows.engine.local_backend.LocalRunBackend` (in
process, over a real state database; tests and embedding) and the worker's host
backend, which forwards each call as one worker-protocol message. That is why every method
maps to exactly one protocol operation (:data:`OPERATIONS`; the worker may carry
several in one ``store.batch`` message, see :meth:`RunBackend.flush`) and takes and
returns plain JSON values only.

Every method may raise :class:`~pi_workflows.errors.ClaimLostError` or
:class:`~pi_workflows.errors.RevisionConflictError`; the engine lets them propagate and
writes nothing more, because another owner now decides about the run.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..protocol.worker_messages import WorkerOperation

# worker-protocol operation → method name
OPERATIONS = {
    WorkerOperation.READ_RUN_STATE: "read_run_state",
    WorkerOperation.WRITE_SNAPSHOT: "write_snapshot",
    WorkerOperation.PUBLISH_UPDATE: "publish_update",
    WorkerOperation.RESERVE_EFFECT: "reserve_effect",
    WorkerOperation.SETTLE_EFFECT: "settle_effect",
    WorkerOperation.CREATE_HUMAN_DECISION_REQUEST: "create_human_decision_request",
    WorkerOperation.REQUEST_INTERACTION: "request_interaction",
    WorkerOperation.ACCEPT_INTERACTION: "accept_interaction",
    WorkerOperation.REJECT_INTERACTION: "reject_interaction",
    WorkerOperation.REQUEST_NOTIFICATION: "request_notification",
    WorkerOperation.REQUEST_PRESENTATION: "request_presentation",
    WorkerOperation.REGISTER_PROCESS: "register_process",
    WorkerOperation.UNREGISTER_PROCESS: "unregister_process",
    WorkerOperation.RECORD_TRANSCRIPT: "record_transcript",
}


class RunBackend(Protocol):
    """Durable state of one run, as the engine sees it."""

    @property
    def run_id(self) -> str:
        """The run this backend writes to."""

    def read_run_state(self, run_id: str | None = None) -> dict[str, Any]:
        """The run (default: this backend's run; a continuation reads its parent).

        Returns ``{runId, workflowName, status, revision, input, parentRunId,
        lineageKind, executionMode, originSessionId, workflowSource, definitionDigest,
        state, acceptedInteraction, candidateInteraction, pendingInteraction,
        decisionAnswer}`` where ``state``
        is the last run-state snapshot (``pi-workflows.run-state.v1``) or ``None`` before the run
        started, ``acceptedInteraction`` is ``{requestId, attemptId, output}`` when the
        in-flight agent attempt has an accepted submission, and ``candidateInteraction``
        is ``{requestId, attemptId, submissionId, output}`` when it has a submission that
        waits for the node's validator (else ``None``); ``pendingInteraction`` is
        ``{requestId, attemptId, prompt}`` when the in-flight attempt's request is pending
        but the snapshot does not wait (the wait was never recorded); ``decisionAnswer`` is
        ``{decisionId, response}``, the recorded winner of the human decision the run
        waits at (else ``None``).
        """

    def write_snapshot(self, snapshot: dict[str, Any], trace_event: dict[str, Any]) -> int:
        """Commit one durable boundary: the full run state plus its trace event.

        Returns the run's new revision.
        """

    def flush(self) -> None:
        """Make every snapshot written so far durable now.

        A backend may hold a snapshot back to commit it with the next write (the worker
        does: one transaction per durable boundary); the engine calls this before it
        runs user code that may be slow outside a node.
        """

    def publish_update(self, update: dict[str, Any]) -> dict[str, Any]:
        """Store ``{type, key, data, nodeId, attemptId}``; returns ``{updateId, sequence}``."""

    def reserve_effect(self, request: dict[str, Any]) -> dict[str, Any]:
        """Reserve ``{effectType, policy, idempotencyKey, payload, nodeId, attemptId}``.

        Returns ``{effectId, outcome}`` with outcome ``reserved`` (run the action),
        ``adopted`` (plus ``result``: do not run it again), ``ambiguous`` (a manual
        effect was left applying: park) or ``conflict`` (plus ``error``).
        """

    def settle_effect(self, settlement: dict[str, Any]) -> dict[str, Any]:
        """Settle ``{effectId, outcome: applied|rejected|ambiguous, result?, error?}``."""

    def create_human_decision_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Create the decision request of a ``human_decision`` attempt; returns its record."""

    def request_interaction(self, request: dict[str, Any]) -> dict[str, Any]:
        """Ask the origin session for an agent step; returns ``{requestId}``.

        ``request`` is ``{nodeId, attemptId, kind, prompt, contract, timeoutMs}``; the host
        keeps the attempt's deadline (``timeoutMs`` of model-turn time) while no worker runs.
        """

    def accept_interaction(self, acceptance: dict[str, Any]) -> dict[str, Any]:
        """The validator accepted ``{requestId, submissionId, attemptId}``: settle it."""

    def reject_interaction(self, rejection: dict[str, Any]) -> dict[str, Any]:
        """The validator refused ``{requestId, submissionId, attemptId, error}``."""

    def request_notification(self, notification: dict[str, Any]) -> dict[str, Any]:
        """Deliver a notify node's message; returns ``{notificationId, targetSessionId}``."""

    def request_presentation(self, presentation: dict[str, Any]) -> dict[str, Any]:
        """Record ``{prompt}`` for the terminal message of the run."""

    def register_process(self, group: dict[str, Any]) -> dict[str, Any]:
        """Register ``{processGroup, kind}`` before the group runs a user command.

        ``kind`` is ``shell`` or ``agent``. Whoever supervises the run stops a registered
        group that outlives its worker (SPEC §7.4a); raising refuses the group.
        """

    def unregister_process(self, group: dict[str, Any]) -> dict[str, Any]:
        """``{processGroup}`` ended and nothing of it is left running."""

    def record_transcript(self, transcript: dict[str, Any]) -> dict[str, Any]:
        """Keep ``{nodeId, attemptId, entries}``, what the agent did in one attempt."""
