"""The types of the events a run's history holds: one name per kind of change.

Every writer (the engine through its worker, the host, the state store) names its event
with a member of :class:`EventType`, and every reader compares with one, so a name is
spelt in this module only. The stored value is the member's text (a ``StrEnum``), one
style for all, ``subject.what_happened``: it is what the audit plugin's `audit events`,
`run watch` and `piw_run_transition`'s detail show. Schema v4 renamed the engine's older
``run_started`` style names (storage.schema_upgrade.RENAMED_EVENTS).
"""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    """What one run event records (the ``events.event_type`` column)."""

    # --- written by the engine, in its worker: the run's trace -------------------------
    #: the run began at its first node (payload: workflowName, input; a continuation adds
    #: continuedFrom, checkpoint, carriedSteps; a restart restartOf).
    RUN_STARTED = "run.started"
    #: a worker picked up a run already under way from its last durable boundary (after
    #: a park, a pause, a crash or a host restart): resumeAt, resumedAttemptId?,
    #: replayedSteps.
    RUN_RELAUNCHED = "run.relaunched"
    #: the run ended with its final output (status, finalOutput, presentationRequired).
    RUN_COMPLETED = "run.completed"
    #: the run reached a checkpoint and waits there (status, waitingOn, finalOutput).
    RUN_WAITING = "run.waiting"
    #: the run failed (status, error).
    RUN_FAILED = "run.failed"
    #: the run ran out of time (status, error).
    RUN_TIMED_OUT = "run.timed_out"
    #: the run was cancelled (status, error).
    RUN_CANCELLED = "run.cancelled"
    #: a node attempt began (nodeType, statusDetail?).
    NODE_STARTED = "node.started"
    #: a node attempt ended well (its step: outcome "ok", output, durationMs, …).
    NODE_FINISHED = "node.finished"
    #: a node attempt failed, timed out or was cancelled (its step: outcome, error, …).
    NODE_FAILED = "node.failed"
    #: an agent step asked its origin session for the answer (prompt, completion,
    #: requestId).
    AGENT_PROMPT_SENT = "agent.prompt_sent"
    #: an agent step's transcript was kept (nodeId, attemptId, transcriptHash, entryCount;
    #: partial: a chunk saved while the step runs).
    AGENT_TRANSCRIPT_RECORDED = "agent.transcript_recorded"
    #: an action node published an update (updateId, sequence, type, key, data).
    UPDATE_PUBLISHED = "update.published"

    # --- written by the host and the state store -----------------------------------------
    #: the run was created, queued (status).
    RUN_CREATED = "run.created"
    #: a host claimed the run (expiresAt; the event's lease generation is the claim's).
    LEASE_CLAIMED = "lease.claimed"
    #: the claimed run's worker is ready: its queue row runs (status).
    RUN_QUEUE_RUNNING = "run.queue_running"
    #: the claim was released and the run parked, to be claimed again (status, code).
    RUN_QUEUE_PARKED = "run.queue_parked"
    #: the host ended the run as cancelled (status, code, error).
    RUN_QUEUE_CANCELLED = "run.queue_cancelled"
    #: the host ended the run as failed (status, code, error).
    RUN_QUEUE_FAILED = "run.queue_failed"
    #: a waiting run's queue row is done: a continuation carries it on (continuationRunId).
    RUN_QUEUE_DONE_FOR_CONTINUATION = "run.queue_done_for_continuation"
    #: parked: its workers died before any progress (status, code).
    RUN_WORKER_NO_PROGRESS = "run.worker_no_progress"
    #: parked: its workers died at the same node too often (status, code).
    RUN_WORKER_CRASH_LOOP = "run.worker_crash_loop"
    #: parked: the workflow's source changed since the run started (status, code).
    RUN_SOURCE_CHANGED = "run.source_changed"
    #: parked: an effect may or may not have happened; an operator decides (status,
    #: code).
    RUN_EFFECT_AMBIGUOUS = "run.effect_ambiguous"
    #: parked to wait again: its origin session rejected a submission (status, code).
    RUN_INTERACTION_REJECTED = "run.interaction_rejected"
    #: the wait for an origin session's answer began its deadline (requestId, attemptId).
    RUN_INTERACTION_TIMEOUT_STARTED = "run.interaction_timeout_started"
    #: the run was paused: `run pause`, or an aborted session turn (status; reason).
    RUN_PAUSED = "run.paused"
    #: a paused run was resumed by `run resume` (status).
    RUN_RESUMED = "run.resumed"
    #: an agent step asked its origin session (requestId, nodeId).
    INTERACTION_REQUESTED = "interaction.requested"
    #: the origin session submitted an answer (requestId, submissionId).
    INTERACTION_SUBMITTED = "interaction.submitted"
    #: the step accepted the submitted answer (requestId, submissionId).
    INTERACTION_ACCEPTED = "interaction.accepted"
    #: the step's validator rejected the submitted answer (requestId, submissionId).
    INTERACTION_REJECTED = "interaction.rejected"
    #: the session's turn stopped the waiting step's deadline clock (requestId,
    #: attemptId).
    INTERACTION_TURN_INTERRUPTED = "interaction.turn_interrupted"
    #: the step's deadline clock runs again after the session's turn (requestId,
    #: attemptId, givenBackMs).
    INTERACTION_TURN_RESUMED = "interaction.turn_resumed"
    #: a node asked for a notification (notificationId, nodeId).
    NOTIFICATION_REQUESTED = "notification.requested"
    #: the run asked its session to present its result (promptDigest).
    PRESENTATION_REQUESTED = "presentation.requested"
    #: a checkpoint asked for a human decision (decisionId, nodeId).
    HUMAN_DECISION_REQUESTED = "human_decision.requested"
    #: a human decision was answered (decisionId, provenance).
    HUMAN_DECISION_ACCEPTED = "human_decision.accepted"
    #: a human decision was cancelled (decisionId, provenance).
    HUMAN_DECISION_CANCELLED = "human_decision.cancelled"
    #: an effect was reserved before its action runs (effectId, effectType).
    EFFECT_RESERVED = "effect.reserved"
    #: an effect may or may not have happened (effectId, effectType; when its run was
    #: cancelled mid-action: effectId, runId, reason).
    EFFECT_AMBIGUOUS = "effect.ambiguous"
    #: an effect's action ended (effectId, outcome).
    EFFECT_SETTLED = "effect.settled"
    #: an effect pending when its run was cancelled will not run (effectId, runId,
    #: reason).
    EFFECT_CANCELLED = "effect.cancelled"
    #: the host took over the effects a dead worker left applying (pending: idempotent
    #: ones to run again; ambiguous: manual ones an operator decides).
    EFFECT_RECOVERED = "effect.recovered"
    #: an operator said an effect in doubt happened: `effects confirm` (effectId).
    EFFECT_CONFIRMED = "effect.confirmed"
    #: an operator said an effect in doubt may run again: `effects retry` (effectId).
    EFFECT_RETRIED = "effect.retried"


#: The engine's event for each status a run's trace can end (or wait) with.
RUN_ENDS: dict[str, EventType] = {
    "completed": EventType.RUN_COMPLETED,
    "waiting": EventType.RUN_WAITING,
    "failed": EventType.RUN_FAILED,
    "timed_out": EventType.RUN_TIMED_OUT,
    "cancelled": EventType.RUN_CANCELLED,
}
#: The run-level events of the engine's trace (what `run watch` shows as run progress).
TRACE_RUN_EVENTS = frozenset({EventType.RUN_STARTED, EventType.RUN_RELAUNCHED, *RUN_ENDS.values()})
#: The events that end a node attempt.
NODE_ENDS = frozenset({EventType.NODE_FINISHED, EventType.NODE_FAILED})
