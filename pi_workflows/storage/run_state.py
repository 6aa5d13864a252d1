"""The database side of the engine's store operations (engine/store.py).

Each function is one durable change: call it inside ``StateStore.transaction()``. A
change bumps the run revision once and appends one event (``record_run_change``); with
``expected_revision`` a stale caller gets :class:`RevisionConflictError`. Claim fencing
and lifecycle projection are the host's job and deliberately not done here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from typing import Any

from peewee import JOIN

from ..canonical import digest
from ..clock import now_ms
from ..errors import ConflictError, InvalidInputError, NotFoundError
from ..event_types import EventType
from ..records import MessageContent, NodeAttemptRecord, RunRecord
from . import (
    decision_records,
    decision_resolutions,
    effects,
    known_attempts,
    run_transitions,
    statements,
)
from .blobs import put_json, put_json_in_parts_together, put_text, read_json, read_json_joined
from .models import (
    TERMINAL_RUN_STATUSES,
    Blob,
    Effect,
    InteractiveRequest,
    InteractiveSubmission,
    NodeAttempt,
    Run,
    WorkflowUpdate,
)
from .prepared import PreparedQuery, model_instance
from .revisions import record_run_change
from .runs import current_revision, get_run, run_fields
from .step_deadlines import set_deadline
from .workflow_messages import (
    cancel_pending_for_source,
    create_workflow_message,
    workflow_message_id,
)

RUN_STATE_SCHEMA = "pi-workflows.run-state.v1"
MAX_UPDATE_PAIRS = 1024
ACTOR = "worker"
ACTIVE_ATTEMPT_STATUSES = ("pending", "running", "waiting")
OUTCOME_TO_ATTEMPT_STATUS = {
    "ok": "completed",
    "failed": "failed",
    "timed_out": "timed_out",
    "cancelled": "cancelled",
}


def _revision(run_id: str) -> int:
    revision = current_revision(run_id)
    if revision is None:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    return revision


def _change(
    run_id: str,
    event_type: EventType,
    payload: dict[str, Any],
    expected_revision: int | None,
    **updates: Any,
) -> int:
    return record_run_change(
        run_id,
        event_type=event_type,
        actor=ACTOR,
        payload=payload,
        expected_revision=expected_revision,
        **updates,
    )


_RUN_STATE_FIELDS = (
    "workflow_name",
    "status",
    "revision",
    "input_hash",
    "parent_run_id",
    "lineage_kind",
    "execution_mode",
    "origin_session_id",
    "workflow_source",
    "definition_digest",
    "state_hash",
)


_INPUT_BLOB, _STATE_BLOB = Blob.alias(), Blob.alias()
# The run's fields with its input's and its last snapshot's blobs: one read.
_RUN_STATE = PreparedQuery(
    lambda p: (
        Run.select(
            *(getattr(Run, name) for name in _RUN_STATE_FIELDS),
            _INPUT_BLOB.media_type,
            _INPUT_BLOB.content,
            _STATE_BLOB.media_type,
            _STATE_BLOB.content,
        )
        .join(_INPUT_BLOB, JOIN.LEFT_OUTER, on=(_INPUT_BLOB.blob_hash == Run.input_hash))
        .join(_STATE_BLOB, JOIN.LEFT_OUTER, on=(_STATE_BLOB.blob_hash == Run.state_hash))
        .where(Run.run_id == p.run_id)
    ),
    planned=True,
)


def read_run_state(run_id: str) -> dict[str, Any]:
    """The run's identity, input and last snapshot (see ``RunBackend.read_run_state``)."""
    row = _RUN_STATE.first(run_id=run_id)
    if row is None:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    (
        workflow_name,
        status,
        revision,
        input_hash,
        parent_run_id,
        lineage_kind,
        execution_mode,
        origin_session_id,
        workflow_source,
        definition_digest,
        state_hash,
        *blobs,
    ) = row
    input_type, input_content, state_type, state_content = blobs
    state = read_json_joined(state_hash, state_type, state_content)
    return _run_state(
        run_id,
        workflow_name=workflow_name,
        status=status,
        revision=revision,
        input=read_json_joined(input_hash, input_type, input_content),
        parent_run_id=parent_run_id,
        lineage_kind=lineage_kind,
        execution_mode=execution_mode,
        origin_session_id=origin_session_id,
        workflow_source=json.loads(workflow_source),
        definition_digest=definition_digest,
        state=state,
    )


def unstarted_run_state(
    record: RunRecord, workflow_source: dict[str, Any], definition_digest: str
) -> dict[str, Any]:
    """`read_run_state` of a run that has no snapshot yet, from its record and its
    worker's launch envelope (the workflow source and digest): nothing to read."""
    return _run_state(
        record.run_id,
        workflow_name=record.workflow_name,
        status=record.status,
        revision=record.revision,
        input=record.input,
        parent_run_id=record.parent_run_id,
        lineage_kind=record.lineage_kind,
        execution_mode=record.execution_mode,
        origin_session_id=record.origin_session_id,
        workflow_source=workflow_source,
        definition_digest=definition_digest,
        state=None,
    )


def _run_state(
    run_id: str,
    *,
    workflow_name: str,
    status: str,
    revision: int,
    input: Any,
    parent_run_id: str | None,
    lineage_kind: str | None,
    execution_mode: str,
    origin_session_id: str | None,
    workflow_source: dict[str, Any],
    definition_digest: str,
    state: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "runId": run_id,
        "workflowName": workflow_name,
        "status": status,
        "revision": revision,
        "input": input,
        "parentRunId": parent_run_id,
        "lineageKind": lineage_kind,
        "executionMode": execution_mode,
        "originSessionId": origin_session_id,
        "workflowSource": workflow_source,
        "definitionDigest": definition_digest,
        "state": state,
        "acceptedInteraction": _accepted_interaction(state),
        "candidateInteraction": _candidate_interaction(state),
        "pendingInteraction": _unrecorded_wait(state),
        "decisionAnswer": _decision_answer(run_id, state),
    }


def _unrecorded_wait(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pending request of the in-flight attempt of a run whose snapshot does not wait:
    the request was recorded, then its worker or host died before the waiting snapshot."""
    if state is None:
        return None
    attempt_id = state.get("currentAttemptId")
    if attempt_id is None or state.get("status") == "waiting":
        return None
    request = InteractiveRequest.get_or_none(
        (InteractiveRequest.attempt_id == attempt_id) & (InteractiveRequest.status == "pending")
    )
    if request is None:
        return None
    contract = read_json(request.contract_hash)
    return {"requestId": request.request_id, "attemptId": attempt_id, "prompt": contract["prompt"]}


def _decision_answer(run_id: str, state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The recorded winning response of the human decision a waiting run stopped at."""
    node_id = (state or {}).get("waitingOn")
    if node_id is None:
        return None
    return decision_resolutions.winning_response(run_id, node_id)


_ATTEMPT_REQUEST = PreparedQuery(
    lambda p: InteractiveRequest.select().where(InteractiveRequest.attempt_id == p.attempt_id),
    planned=True,
)


def _attempt_request(state: dict[str, Any] | None) -> InteractiveRequest | None:
    """The interactive request of the run's in-flight attempt, if it made one."""
    attempt_id = (state or {}).get("currentAttemptId")
    if attempt_id is None:
        return None
    row = _ATTEMPT_REQUEST.first(attempt_id=attempt_id)
    return None if row is None else model_instance(InteractiveRequest, row)


def _accepted_interaction(state: dict[str, Any] | None) -> dict[str, Any] | None:
    request = _attempt_request(state)
    if request is None or request.accepted_submission_id is None:
        return None
    submission = InteractiveSubmission.get_by_id(request.accepted_submission_id)
    return {
        "requestId": request.request_id,
        "attemptId": request.attempt_id,
        "output": read_json(submission.payload_hash),
    }


def _candidate_interaction(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The submission of the in-flight agent attempt that waits for its validator."""
    request = _attempt_request(state)
    if request is None or request.status != "pending":
        return None
    submission = InteractiveSubmission.get_or_none(
        (InteractiveSubmission.request == request.request_id)
        & (InteractiveSubmission.outcome == "validating")
    )
    if submission is None:
        return None
    return {
        "requestId": request.request_id,
        "attemptId": request.attempt_id,
        "submissionId": submission.submission_id,
        "output": read_json(submission.payload_hash),
    }


def _validating_submission(run_id: str, decision: dict[str, Any]) -> InteractiveSubmission:
    submission = InteractiveSubmission.get_or_none(
        InteractiveSubmission.submission_id == decision["submissionId"]
    )
    request = InteractiveRequest.get_or_none(InteractiveRequest.request_id == decision["requestId"])
    if (
        submission is None
        or request is None
        or submission.request_id != request.request_id
        or request.run_id != run_id
        or request.attempt_id != decision["attemptId"]
    ):
        raise ConflictError("Interactive submission does not match the worker candidate")
    return submission


def accept_interaction(
    run_id: str, acceptance: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """The validator accepted a submission: settle its request (SPEC §9.5)."""
    submission = _validating_submission(run_id, acceptance)
    request = submission.request
    if (
        submission.outcome == "accepted"
        and request.accepted_submission_id == submission.submission_id
    ):
        return {"requestId": request.request_id, "revision": _revision(run_id)}
    if submission.outcome != "validating" or request.status != "pending":
        raise ConflictError("Interactive submission does not match the worker candidate")
    stamp = now_ms()
    InteractiveSubmission.update(
        outcome="accepted", receipt_hash=put_json({"status": "accepted"})
    ).where(InteractiveSubmission.submission_id == submission.submission_id).execute()
    InteractiveRequest.update(
        status="settled",
        accepted_submission_id=submission.submission_id,
        settled_at=stamp,
        updated_at=stamp,
        revision=InteractiveRequest.revision + 1,
    ).where(InteractiveRequest.request_id == request.request_id).execute()
    cancel_pending_for_source(request.request_id)
    revision = _change(
        run_id,
        EventType.INTERACTION_ACCEPTED,
        {"requestId": request.request_id, "submissionId": submission.submission_id},
        expected_revision,
    )
    return {"requestId": request.request_id, "revision": revision}


def reject_interaction(
    run_id: str, rejection: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """The validator refused a submission: the request stays pending for another try."""
    submission = _validating_submission(run_id, rejection)
    if submission.outcome != "validating":
        raise ConflictError("Interactive submission does not match the worker candidate")
    error = str(rejection.get("error") or "Workflow step output failed validation")
    InteractiveSubmission.update(
        outcome="rejected", receipt_hash=put_json({"status": "rejected", "error": error})
    ).where(InteractiveSubmission.submission_id == submission.submission_id).execute()
    revision = _change(
        run_id,
        EventType.INTERACTION_REJECTED,
        {"requestId": submission.request_id, "submissionId": submission.submission_id},
        expected_revision,
    )
    return {"requestId": submission.request_id, "revision": revision}


def _trace_event_type(trace_event: dict[str, Any]) -> EventType:
    """The engine's event type of a snapshot (sent over the worker protocol as text)."""
    text = str(trace_event.get("type"))
    try:
        return EventType(text)
    except ValueError:
        raise InvalidInputError(
            f"A snapshot's trace event has an unknown type {text[:64]!r}; the worker and "
            "the host must be the same pi-workflows."
        ) from None


def write_snapshot(
    run_id: str,
    snapshot: dict[str, Any],
    trace_event: dict[str, Any],
    expected_revision: int | None = None,
) -> int:
    """Commit a run-state snapshot and its trace event; returns the new revision.

    Also keeps ``node_attempts`` in step with the snapshot: recorded steps get their
    final status, the in-flight attempt is ``running`` (``waiting`` for a waiting run),
    and any other attempt left active is ``interrupted`` — a parked attempt is never
    recorded as a step.
    """
    if snapshot.get("schema") != RUN_STATE_SCHEMA or snapshot.get("runId") != run_id:
        raise InvalidInputError(
            f"A snapshot for run {run_id} must have schema {RUN_STATE_SCHEMA} and its run id."
        )
    status = snapshot["status"]
    state_hash, event_hash = put_json_in_parts_together([snapshot, trace_event])
    revision = record_run_change(
        run_id,
        event_type=_trace_event_type(trace_event),
        actor=ACTOR,
        payload_hash=event_hash,
        expected_revision=expected_revision,
        status=status,
        status_detail=snapshot.get("statusDetail"),
        state_hash=state_hash,
        final_output_hash=(
            put_json(snapshot["finalOutput"]) if "finalOutput" in snapshot else None
        ),
        error_hash=put_text(snapshot["error"]) if snapshot.get("error") else None,
        finished_at=now_ms() if status in TERMINAL_RUN_STATUSES else None,
    )
    _sync_attempts(run_id, snapshot, revision)
    return revision


def _sync_attempts(run_id: str, snapshot: dict[str, Any], revision: int) -> None:
    """Bring the run's attempts in step with the snapshot its write of `revision` holds."""
    existing = known_attempts.known(run_id, revision - 1)
    if existing is None:
        existing = {
            attempt_id: (node_id, number, status, node_type, started_at)
            for attempt_id, node_id, number, status, node_type, started_at in (
                statements.run_attempts(run_id)
            )
        }
    synced = dict(existing)
    numbers: dict[str, int] = {}
    for node_id, number, *_ in existing.values():
        numbers[node_id] = max(numbers.get(node_id, 0), number)
    wanted: dict[str, dict[str, Any]] = {}
    steps: dict[str, dict[str, Any]] = {}  # attempt id -> its step, for the notifications
    # Steps carried over from a continuation's parent stay attempts of the parent.
    for step in snapshot.get("steps", [])[snapshot.get("carriedStepCount", 0) :]:
        status = OUTCOME_TO_ATTEMPT_STATUS[step["outcome"]]
        known = existing.get(step["attemptId"])
        if known is not None and known[2] == status:
            wanted[step["attemptId"]] = {"status": status}  # recorded already: no blobs
            continue
        steps[step["attemptId"]] = step
        wanted[step["attemptId"]] = {
            "node_id": step["nodeId"],
            "node_type": step["nodeType"],
            "status": status,
            "started_at": step["startedAt"],
            "finished_at": step["finishedAt"],
            "output_hash": put_json(step["output"]) if step["outcome"] == "ok" else None,
            "error_hash": put_text(step["error"]) if step.get("error") else None,
        }
    current = snapshot.get("currentAttemptId")
    if current is not None:
        wanted[current] = {
            "node_id": snapshot["currentNode"],
            "node_type": snapshot["currentNodeType"],
            "status": "waiting" if snapshot["status"] == "waiting" else "running",
            "started_at": snapshot["currentNodeStartedAt"],
        }
    # Interrupt first: the one-active-attempt index must allow the new attempt.
    now = now_ms()
    for attempt_id, (node_id, _, status, node_type, started_at) in existing.items():
        if status in ACTIVE_ATTEMPT_STATUSES and attempt_id not in wanted:
            _INTERRUPT_ATTEMPT.execute_later(attempt_id=attempt_id, now=now)
            synced[attempt_id] = (
                node_id,
                existing[attempt_id][1],
                "interrupted",
                node_type,
                started_at,
            )
            note_attempt_finished(
                attempt_record(run_id, attempt_id, node_id, node_type, started_at),
                "interrupted",
                now,
            )
    for attempt_id, fields in wanted.items():
        known = existing.get(attempt_id)
        if known is None:
            numbers[fields["node_id"]] = numbers.get(fields["node_id"], 0) + 1
            _INSERT_ATTEMPT.execute_later(
                **_NEW_ATTEMPT,
                **fields,
                attempt_id=attempt_id,
                run_id=run_id,
                attempt_number=numbers[fields["node_id"]],
            )
            record = attempt_record(
                run_id, attempt_id, fields["node_id"], fields["node_type"], fields["started_at"]
            )
            run_transitions.note_attempt("started", record)
            synced[attempt_id] = (
                fields["node_id"],
                numbers[fields["node_id"]],
                fields["status"],
                fields["node_type"],
                fields["started_at"],
            )
        elif known[2] != fields["status"]:
            _attempt_update(tuple(fields)).execute_later(**fields, attempt_id=attempt_id)
            record = attempt_record(run_id, attempt_id, known[0], known[3], known[4])
            synced[attempt_id] = (
                fields.get("node_id", known[0]),
                known[1],
                fields["status"],
                fields.get("node_type", known[3]),
                fields.get("started_at", known[4]),
            )
        else:
            continue
        step = steps.get(attempt_id)
        ended_now = known is None or known[2] in ACTIVE_ATTEMPT_STATUSES
        if step is not None and ended_now and fields["status"] not in ACTIVE_ATTEMPT_STATUSES:
            error, error_class = step.get("error"), step.get("errorClass")
            record = dataclasses.replace(record, agent=step.get("agent"))
            note_attempt_finished(record, fields["status"], step["finishedAt"], error, error_class)
    known_attempts.note(run_id, revision, synced)


def attempt_record(
    run_id: str, attempt_id: str, node_id: str, node_kind: str, started_at: int
) -> NodeAttemptRecord:
    # The workflow name and attempt number are read when the transaction commits.
    return NodeAttemptRecord(
        run_id=run_id,
        workflow_name="",
        node_id=node_id,
        node_kind=node_kind,
        attempt_id=attempt_id,
        attempt_number=0,
        started_at=started_at,
    )


def note_attempt_finished(
    record: NodeAttemptRecord,
    outcome: str,
    finished_at: int,
    error: str | None = None,
    error_class: str | None = None,
) -> None:
    """Note that an attempt ended with `outcome`, for `piw_node_attempt_finished`."""
    if error is not None and error_class is not None and error.startswith(f"{error_class}: "):
        error = error[len(error_class) + 2 :]  # the step's text names the class first
    run_transitions.note_attempt(
        "finished",
        dataclasses.replace(
            record,
            finished_at=finished_at,
            outcome=outcome,
            error_class=error_class,
            error_message=error,
        ),
    )


_INTERRUPT_ATTEMPT = PreparedQuery(
    lambda p: NodeAttempt.update(status="interrupted", finished_at=p.now).where(
        NodeAttempt.attempt_id == p.attempt_id
    ),
    planned=True,
)
# The columns `_sync_attempts` may set; those a snapshot does not give stay NULL.
_NEW_ATTEMPT = dict.fromkeys(("finished_at", "output_hash", "error_hash"))
_INSERT_ATTEMPT = PreparedQuery(
    lambda p: NodeAttempt.insert(
        attempt_id=p.attempt_id,
        run=p.run_id,
        attempt_number=p.attempt_number,
        node_id=p.node_id,
        node_type=p.node_type,
        status=p.status,
        started_at=p.started_at,
        finished_at=p.finished_at,
        output_hash=p.output_hash,
        error_hash=p.error_hash,
    ),
    planned=True,
)


@functools.cache
def _attempt_update(columns: tuple[str, ...]) -> PreparedQuery:
    """The update of an attempt's `columns` (a few fixed sets, so a few statements)."""
    return PreparedQuery(
        lambda p: NodeAttempt.update(
            {getattr(NodeAttempt, name): getattr(p, name) for name in columns}
        ).where(NodeAttempt.attempt_id == p.attempt_id),
        planned=True,
    )


def publish_update(
    run_id: str, update: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """Replace the current value of ``(type, key)`` and record one ``update.published``."""
    existing = WorkflowUpdate.get_or_none(
        (WorkflowUpdate.run == run_id)
        & (WorkflowUpdate.update_type == update["type"])
        & (WorkflowUpdate.update_key == update["key"])
    )
    if existing is None:
        pairs = WorkflowUpdate.select().where(WorkflowUpdate.run == run_id).count()
        if pairs >= MAX_UPDATE_PAIRS:
            raise InvalidInputError(
                f"Workflow run {run_id} already has {MAX_UPDATE_PAIRS} update keys; reuse a "
                "key instead of adding new ones."
            )
    sequence = (
        WorkflowUpdate.select(WorkflowUpdate.sequence)
        .where(WorkflowUpdate.run == run_id)
        .order_by(WorkflowUpdate.sequence.desc())
        .limit(1)
        .scalar()
        or 0
    ) + 1
    stamp = now_ms()
    update_id = f"upd-{uuid.uuid4().hex}"
    fields = {
        "attempt_id": update.get("attemptId"),
        "data_hash": put_json(update["data"]),
        "sequence": sequence,
        "updated_at": stamp,
    }
    if existing is None:
        WorkflowUpdate.create(
            run=run_id,
            update_type=update["type"],
            update_key=update["key"],
            created_at=stamp,
            **fields,
        )
    else:
        WorkflowUpdate.update(**fields).where(WorkflowUpdate.id == existing.id).execute()
    revision = _change(
        run_id,
        EventType.UPDATE_PUBLISHED,
        {"updateId": update_id, "sequence": sequence, **update},
        expected_revision,
    )
    return {"updateId": update_id, "sequence": sequence, "revision": revision}


def reserve_effect(
    run_id: str, request: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """Reserve a managed effect before its action runs (see ``RunBackend.reserve_effect``)."""
    payload_hash = put_json(request.get("payload"))
    effect = Effect.get_or_none(
        (Effect.run == run_id)
        & (Effect.effect_type == request["effectType"])
        & (Effect.idempotency_key == request["idempotencyKey"])
    )
    stamp = now_ms()
    if effect is None:
        effect = Effect.create(
            effect_id=f"eff-{uuid.uuid4().hex}",
            run=run_id,
            scope="run",
            effect_type=request["effectType"],
            idempotency_key=request["idempotencyKey"],
            policy=request["policy"],
            payload_hash=payload_hash,
            status="applying",
            attempt_count=1,
            created_at=stamp,
            updated_at=stamp,
        )
        return _effect_change(run_id, effect, "reserved", expected_revision)
    if effect.status == "ambiguous" or (effect.status == "applying" and effect.policy == "manual"):
        # A manual effect whose action may or may not have happened: only an operator
        # can tell, so the run must not guess by running it again (whatever it requests).
        Effect.update(status="ambiguous", updated_at=stamp).where(
            Effect.effect_id == effect.effect_id
        ).execute()
        return _effect_change(run_id, effect, "ambiguous", expected_revision)
    if effect.payload_hash != payload_hash and not effects.judged_by_operator(effect):
        return {
            "effectId": effect.effect_id,
            "outcome": "conflict",
            "error": f"Effect {effect.effect_type!r} was already reserved for another request.",
            "revision": _revision(run_id),
        }
    if effect.status == "applied":
        if effect.payload_hash != payload_hash:  # the verdict now holds this request
            Effect.update(payload_hash=payload_hash).where(
                Effect.effect_id == effect.effect_id
            ).execute()
        return {
            "effectId": effect.effect_id,
            "outcome": "adopted",
            "result": read_json(effect.result_hash),
            "revision": _revision(run_id),
        }
    Effect.update(
        status="applying",
        payload_hash=payload_hash,
        attempt_count=Effect.attempt_count + 1,
        updated_at=stamp,
    ).where(Effect.effect_id == effect.effect_id).execute()
    return _effect_change(run_id, effect, "reserved", expected_revision)


# The event of each outcome a reservation is recorded with.
EFFECT_OUTCOMES = {"reserved": EventType.EFFECT_RESERVED, "ambiguous": EventType.EFFECT_AMBIGUOUS}


def _effect_change(
    run_id: str, effect: Effect, outcome: str, expected_revision: int | None
) -> dict[str, Any]:
    revision = _change(
        run_id,
        EFFECT_OUTCOMES[outcome],
        {"effectId": effect.effect_id, "effectType": effect.effect_type},
        expected_revision,
    )
    return {"effectId": effect.effect_id, "outcome": outcome, "revision": revision}


def settle_effect(
    run_id: str, settlement: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """Record what happened to a reserved effect: applied, rejected or ambiguous."""
    outcome = settlement["outcome"]
    if outcome not in ("applied", "rejected", "ambiguous"):
        raise InvalidInputError(f"Unknown effect settlement {outcome!r}.")
    effect = Effect.get_or_none(
        (Effect.effect_id == settlement["effectId"]) & (Effect.run == run_id)
    )
    if effect is None:
        raise NotFoundError(f"Effect {settlement['effectId']} of run {run_id} does not exist.")
    stamp = now_ms()
    Effect.update(
        status=outcome,
        result_hash=put_json(settlement.get("result")) if outcome == "applied" else None,
        error_hash=put_text(settlement["error"]) if settlement.get("error") else None,
        settled_at=stamp,
        updated_at=stamp,
    ).where(Effect.effect_id == effect.effect_id).execute()
    revision = _change(
        run_id,
        EventType.EFFECT_SETTLED,
        {"effectId": effect.effect_id, "outcome": outcome},
        expected_revision,
    )
    return {"effectId": effect.effect_id, "outcome": outcome, "revision": revision}


def create_human_decision_request(
    run_id: str, request: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """Create (or adopt, for a repeated attempt) the request record of a human decision.

    The record (``storage.decision_records``) comes back without its subject.
    """
    record, created = decision_records.create_request(run_id, request)
    if not created:
        return {**record, "revision": _revision(run_id)}
    revision = _change(
        run_id,
        EventType.HUMAN_DECISION_REQUESTED,
        {"decisionId": record["decisionId"], "nodeId": request["nodeId"]},
        expected_revision,
    )
    if decision_resolutions.supersede_earlier_requests(
        run_id, request["nodeId"], record["decisionId"]
    ):
        revision = _revision(run_id)  # each cancellation is a run change of its own
    return {**record, "revision": revision}


def request_interaction(
    run_id: str, request: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """Create the durable request for an interactive agent step (one per attempt)."""
    existing = InteractiveRequest.get_or_none(InteractiveRequest.attempt_id == request["attemptId"])
    if existing is not None:
        return {"requestId": existing.request_id, "revision": _revision(run_id)}
    set_deadline(request["attemptId"], request.get("timeoutMs"))
    run = get_run(run_id)
    stamp = now_ms()
    request_id = f"req-{uuid.uuid4().hex}"
    InteractiveRequest.create(
        request_id=request_id,
        run=run_id,
        attempt_id=request["attemptId"],
        node_id=request["nodeId"],
        target_session_id=run.origin_session_id,
        kind=request.get("kind", "agent"),
        contract_hash=put_json(
            {
                "contract": request["contract"],
                "prompt": request["prompt"],
                "presentation": request.get("presentation"),
            }
        ),
        status="pending",
        created_at=stamp,
        updated_at=stamp,
    )
    revision = _change(
        run_id,
        EventType.INTERACTION_REQUESTED,
        {"requestId": request_id, "nodeId": request["nodeId"]},
        expected_revision,
    )
    return {"requestId": request_id, "revision": revision}


def timed_out_interaction_attempt(run_id: str, status: str) -> str | None:
    """The waiting attempt whose interaction the host cancelled at its deadline, if any;
    `status` is the run's, just read (a run that is not waiting has none: no read).

    Only a deadline cancels the request of a run that is still waiting: the other
    cancellations (unproductive turns, run cancel) end the run in the same transaction.
    """
    if status != "waiting":
        return None
    (state_hash,) = run_fields(run_id, "state_hash")
    attempt_id = (read_json(state_hash) or {}).get("currentAttemptId")
    if attempt_id is None:
        return None
    request = InteractiveRequest.get_or_none(InteractiveRequest.attempt_id == attempt_id)
    return attempt_id if request is not None and request.status == "cancelled" else None


def request_notification(
    run_id: str, notification: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """Queue a notify node's message for the origin session, once per notification index."""
    run = get_run(run_id)
    if run.origin_session_id is None:
        raise InvalidInputError(
            f"Workflow run {run_id} has no origin session, so notify node "
            f"{notification['nodeId']!r} has nobody to tell; run it from a session."
        )
    if notification.get("workflowName", run.workflow_name) != run.workflow_name:
        raise InvalidInputError("Workflow notification provenance does not match the active run")
    index = notification["notificationIndex"]
    if type(index) is not int or index < 1 or notification["kind"] not in ("progress", "final"):
        raise InvalidInputError(
            "A notification needs a positive notificationIndex and kind progress or final"
        )
    notification_id = f"notification-{run_id}-{notification['attemptId']}-{index}"
    message_id = workflow_message_id("notification", notification_id, "initial")
    _, created = create_workflow_message(
        run_id=run_id,
        target_session_id=run.origin_session_id,
        kind="notification",
        source_id=notification_id,
        idempotency_key="initial",
        content=MessageContent(
            text=notification["content"],
            details={
                "workflowMessageId": message_id,
                "notificationId": notification_id,
                "runId": run_id,
                "nodeId": notification["nodeId"],
                "notificationIndex": index,
                "kind": notification["kind"],
            },
        ),
    )
    revision = (
        _change(
            run_id,
            EventType.NOTIFICATION_REQUESTED,
            {"notificationId": notification_id, "nodeId": notification["nodeId"]},
            expected_revision,
        )
        if created
        else _revision(run_id)
    )
    return {
        "notificationId": notification_id,
        "targetSessionId": run.origin_session_id,
        "revision": revision,
    }


def record_transcript(
    run_id: str, transcript: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """Keep an agent attempt's transcript (a blob) and record `agent.transcript_recorded`.

    ``partial: true`` marks a chunk saved while the attempt runs (the entries added since
    the previous chunk); the record without it, when the attempt ends, is the whole
    transcript. Read back with `pi_workflows.storage.transcripts.attempt_transcripts`.
    """
    entries = transcript["entries"]
    if not isinstance(entries, list):
        raise InvalidInputError("A transcript's entries must be a list.")
    transcript_hash = put_json(entries)
    payload = {
        "nodeId": transcript["nodeId"],
        "attemptId": transcript["attemptId"],
        "transcriptHash": transcript_hash,
        "entryCount": len(entries),
        **({"partial": True} if transcript.get("partial") else {}),
    }
    # The payload names the transcript: pruning keeps the transcript while it is kept.
    revision = record_run_change(
        run_id,
        event_type=EventType.AGENT_TRANSCRIPT_RECORDED,
        actor=ACTOR,
        payload_hash=put_json(payload, names=[transcript_hash]),
        expected_revision=expected_revision,
    )
    return {"transcriptHash": transcript_hash, "revision": revision}


def request_presentation(
    run_id: str, presentation: dict[str, Any], expected_revision: int | None = None
) -> dict[str, Any]:
    """Save the presentation prompt the terminal message of this run will use."""
    revision = _change(
        run_id,
        EventType.PRESENTATION_REQUESTED,
        {"promptDigest": digest(presentation["prompt"])},
        expected_revision,
        presentation_prompt_hash=put_text(presentation["prompt"]),
    )
    return {"revision": revision}
