"""The database side of checkpoints and human decisions (SPEC §11).

Request records are immutable and content-addressed; a decision has exactly one
resolution (the primary key of ``human_decision_resolutions`` is the fence), and the
continuation run that carries the answer is reserved with a deterministic id, so
every retry adopts. Call these functions inside ``StateStore.transaction()``.
"""

from __future__ import annotations

import datetime
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, cast, overload

from ..canonical import canonical_json, digest
from ..clock import now_ms
from ..errors import ConflictError, InvalidInputError, NotFoundError
from ..records import ChannelRequest, DecisionResolution
from . import statements
from .blobs import put_json, read_json
from .models import (
    Effect,
    HumanDecision,
    HumanDecisionResolution,
    Lease,
    Run,
    RunQueue,
    WorkflowMessage,
)
from .prepared import PreparedQuery, model_instance
from .revisions import record_run_change
from .runs import create_derived_run, get_run, paused_since

REQUEST_SCHEMA = "pi-workflows.human-decision-request.v1"
PRESENTATION_SCHEMA = "pi-workflows.decision-presentation.v1"
CHANNEL_REQUEST_SCHEMA = "pi-workflows.human-decision-channel-request.v1"

# Presentation limits (reference decisions.md §1.3); exceeding one fails the node
# before the decision becomes pending.
MAX_PRESENTATION_CHARS = 64_000
MAX_BLOCKS = 256
MAX_BLOCK_ITEMS = 256
MAX_STRING_CHARS = 16_000
MAX_INPUT_CHARS = 4_000
BLOCK_TYPES = ("paragraph", "section", "bullets", "fields", "preformatted")
_SINGLE_LINE_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MULTI_LINE_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

PROVENANCE_HUMAN = "human"
PROVENANCE_TIMEOUT = "timeout"
PROVENANCE_CANCELLATION = "cancellation"


@overload
def iso_time(ms: int) -> str: ...
@overload
def iso_time(ms: int | None) -> str | None: ...
def iso_time(ms: int | None) -> str | None:
    if ms is None:
        return None
    stamp = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- request records ----------------------------------------------------------------------


def _text(value: Any, where: str, *, multiline: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{where} must be a string.")
    text = unicodedata.normalize("NFC", value.replace("\r\n", "\n").replace("\r", "\n"))
    if not text.strip():
        raise InvalidInputError(f"{where} must not be empty.")
    if len(text) > MAX_STRING_CHARS:
        raise InvalidInputError(
            f"{where} has {len(text)} characters; the limit is {MAX_STRING_CHARS}."
        )
    pattern = _MULTI_LINE_CONTROL if multiline else _SINGLE_LINE_CONTROL
    if pattern.search(text):
        raise InvalidInputError(f"{where} contains control characters.")
    return text


def _items(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise InvalidInputError(f"{where} must be a non-empty list.")
    if len(value) > MAX_BLOCK_ITEMS:
        raise InvalidInputError(f"{where} has {len(value)} items; the limit is {MAX_BLOCK_ITEMS}.")
    return value


def _block(block: Any, index: int) -> dict[str, Any]:
    where = f"presentation block {index}"
    if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
        raise InvalidInputError(f"{where} must have a type among {', '.join(BLOCK_TYPES)}.")
    kind = block["type"]
    if kind in ("paragraph", "preformatted"):
        return {"type": kind, "text": _text(block.get("text"), f"{where} text", multiline=True)}
    if kind == "section":
        # Sections are titles; `text` is accepted as a synonym authors reach for.
        title = block.get("title", block.get("text"))
        return {"type": kind, "title": _text(title, f"{where} title")}
    items = _items(block.get("items"), f"{where} items")
    if kind == "bullets":
        return {
            "type": kind,
            "items": [_text(item, f"{where} item {i}") for i, item in enumerate(items)],
        }
    fields = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidInputError(f"{where} item {i} must be {{label, value}}.")
        fields.append(
            {
                "label": _text(item.get("label"), f"{where} item {i} label"),
                "value": _text(item.get("value"), f"{where} item {i} value", multiline=True),
            }
        )
    return {"type": kind, "items": fields}


def normalize_presentation(presentation: Any) -> dict[str, Any]:
    """The display allow-list of a decision: summary and typed blocks, nothing else."""
    if not isinstance(presentation, dict):
        raise InvalidInputError("A decision presentation must be an object.")
    blocks = presentation.get("blocks", [])
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        raise InvalidInputError(f"A decision presentation needs at most {MAX_BLOCKS} blocks.")
    normalized: dict[str, Any] = {
        "schema": PRESENTATION_SCHEMA,
        "blocks": [_block(block, i) for i, block in enumerate(blocks)],
    }
    if presentation.get("summary") is not None:
        normalized["summary"] = _text(
            presentation["summary"], "presentation summary", multiline=True
        )
    size = len(canonical_json(normalized))
    if size > MAX_PRESENTATION_CHARS:
        raise InvalidInputError(
            f"The decision presentation has {size} characters; the limit is "
            f"{MAX_PRESENTATION_CHARS}."
        )
    return normalized


def validate_response(choices: dict[str, Any], response: Any, where: str) -> dict[str, Any]:
    """`{"choice": k}` or `{"choice": k, "input": {name: text}}`, checked against the choices."""
    if not isinstance(response, dict) or set(response) - {"choice", "input"}:
        raise InvalidInputError(f"{where} must be {{choice, input?}}.")
    key = response.get("choice")
    if key not in choices:
        known = ", ".join(sorted(choices))
        raise InvalidInputError(f"{where}: {key!r} is not a choice; choose one of {known}.")
    spec = choices[key].get("input")
    given = response.get("input")
    if spec is None:
        if given is not None:
            raise InvalidInputError(f"{where}: choice {key!r} takes no input.")
        return {"choice": key}
    if not isinstance(given, dict) or set(given) != {spec["name"]}:
        raise InvalidInputError(
            f"{where}: choice {key!r} needs its text input {spec['name']!r} ({spec['prompt']})."
        )
    text = given[spec["name"]]
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_INPUT_CHARS:
        raise InvalidInputError(
            f"{where}: input {spec['name']!r} must be 1 to {MAX_INPUT_CHARS} characters."
        )
    return {"choice": key, "input": {spec["name"]: text}}


def decision_id_for(run_id: str, node_id: str, attempt_id: str, request_digest: str) -> str:
    basis = {
        "runId": run_id,
        "nodeId": node_id,
        "attemptId": attempt_id,
        "requestDigest": request_digest,
    }
    return "decision-" + digest(basis)[:40]


def continuation_id_for_decision(decision_id: str) -> str:
    return "continuation-" + decision_id.removeprefix("decision-")


def continuation_id_for_checkpoint(parent_run_id: str) -> str:
    return "continuation-" + digest({"parentRunId": parent_run_id, "kind": "checkpoint"})[:40]


# By run first: `run_id` is indexed, `attempt_id` is not.
_DECISION_OF_ATTEMPT = PreparedQuery(
    lambda p: HumanDecision.select().where(
        (HumanDecision.run == p.run_id) & (HumanDecision.attempt_id == p.attempt_id)
    )
)


def create_request(run_id: str, request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Build and store the request record of a human decision node attempt.

    Returns the record without its subject, and whether it was created now. A repeated
    attempt adopts the stored record when it is canonically the same request.
    """
    run = get_run(run_id)
    title = _text(request.get("title"), "The decision title")
    presentation = normalize_presentation(request.get("presentation"))
    choices = request.get("choices")
    if not isinstance(choices, dict) or not choices:
        raise InvalidInputError("A human decision needs at least one choice.")
    on_timeout = request.get("onTimeout")
    default_response = None
    if on_timeout is not None:
        default_response = validate_response(
            choices, on_timeout.get("response"), "The on_timeout response"
        )
    basis = {
        "schema": REQUEST_SCHEMA,
        "runId": run_id,
        "workflowName": run.workflow_name,
        "nodeId": request["nodeId"],
        "attemptId": request["attemptId"],
        "audience": request["audience"],
        "title": title,
        "choices": choices,
        "timeoutMs": on_timeout["after_ms"] if on_timeout else None,
        "defaultResponse": default_response,
        "subject": request.get("subject"),
        "presentation": presentation,
    }
    request_digest = "sha256:" + digest(basis)
    found = _DECISION_OF_ATTEMPT.first(run_id=run_id, attempt_id=request["attemptId"])
    existing = None if found is None else model_instance(HumanDecision, found)
    if existing is not None:
        if existing.request_digest != request_digest:
            raise ConflictError(
                f"Immutable human decision request conflicts: {existing.decision_id}."
            )
        return public_request(existing), False
    created_at = now_ms()
    deadline_at = created_at + on_timeout["after_ms"] if on_timeout else None
    decision_id = decision_id_for(run_id, request["nodeId"], request["attemptId"], request_digest)
    record = {key: value for key, value in basis.items() if key != "subject"}
    record.update(
        decisionId=decision_id,
        requestDigest=request_digest,
        subjectDigest="sha256:" + digest(basis["subject"]),
        presentationDigest="sha256:" + digest(presentation),
        createdAt=iso_time(created_at),
        deadlineAt=deadline_at,
        expiresAt=iso_time(deadline_at),
    )
    statements.insert_row(
        HumanDecision,
        {
            "decision_id": decision_id,
            "run": run_id,
            "attempt_id": request["attemptId"],
            "node_id": request["nodeId"],
            "audience": request["audience"],
            # The subject stays in the host's copy; channels and the run see the record only.
            "request_hash": put_json({**record, "subject": basis["subject"]}),
            "request_digest": request_digest,
            "status": "pending",
            "deadline_at": deadline_at,
            "default_response_hash": put_json(default_response) if default_response else None,
            "created_at": created_at,
            "updated_at": created_at,
        },
    )
    return record, True


def full_request(decision: HumanDecision) -> dict[str, Any]:
    """The stored record including the subject (host-side use only)."""
    record: dict[str, Any] = read_json(decision.request_hash)
    return record


def public_request(decision: HumanDecision) -> dict[str, Any]:
    record = full_request(decision)
    record.pop("subject", None)
    return record


def channel_request(decision: HumanDecision) -> ChannelRequest:
    """What a channel may see: the presentation and choices, never the subject."""
    record = public_request(decision)
    # The stored request holds every field but the schema (records.ChannelRequest).
    return cast(
        ChannelRequest,
        {
            "schema": CHANNEL_REQUEST_SCHEMA,
            **{
                key: record.get(key)
                for key in (
                    "decisionId",
                    "requestDigest",
                    "runId",
                    "workflowName",
                    "nodeId",
                    "audience",
                    "title",
                    "presentation",
                    "presentationDigest",
                    "choices",
                    "createdAt",
                    "expiresAt",
                    "defaultResponse",
                )
            },
        },
    )


_RUN_HAS_DECISIONS = PreparedQuery(
    lambda p: (
        HumanDecision.select(HumanDecision.decision_id)
        .where(HumanDecision.run == p.run_id)
        .limit(1)
    )
)


_NODE_HAS_DECISIONS = PreparedQuery(
    lambda p: (
        HumanDecision.select(HumanDecision.decision_id)
        .where((HumanDecision.run == p.run_id) & (HumanDecision.node_id == p.node_id))
        .limit(1)
    )
)


def run_has_decisions(run_id: str) -> bool:
    """Did the run ever ask a human decision (open or resolved)?"""
    return _RUN_HAS_DECISIONS.exists(run_id=run_id)


def is_decision_node(run_id: str, node_id: str) -> bool:
    """Did the run ask a human decision at `node_id` (a checkpoint answer may not answer it)?"""
    return _NODE_HAS_DECISIONS.exists(run_id=run_id, node_id=node_id)


_DECISION = PreparedQuery(
    lambda p: HumanDecision.select().where(HumanDecision.decision_id == p.decision_id)
)


def get_decision(decision_id: str) -> HumanDecision:
    row = _DECISION.first(decision_id=decision_id)
    if row is None:
        raise NotFoundError(
            f"Human decision {decision_id} does not exist; see 'pi-workflows decision list'."
        )
    return model_instance(HumanDecision, row)


# --- resolutions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolution:
    """The outcome of trying to resolve a decision."""

    won: bool  # this attempt is the winner (or an identical repeat of it: `adopted`)
    adopted: bool
    winner: DecisionResolution
    continuation_run_id: str | None


def resolution_json(row: HumanDecisionResolution) -> DecisionResolution:
    return {
        "provenance": row.provenance,
        "channel": row.channel,
        "actor": row.actor,
        "response": read_json(row.response_hash),
        "resolvedAt": iso_time(row.resolved_at),
        "continuationRunId": row.continuation_run_id,
    }


_RESOLUTION = PreparedQuery(
    lambda p: HumanDecisionResolution.select().where(
        HumanDecisionResolution.decision == p.decision_id
    )
)
_SET_DECISION_STATUS = PreparedQuery(
    lambda p: HumanDecision.update(status=p.status, updated_at=p.now).where(
        HumanDecision.decision_id == p.decision_id
    )
)
_SET_CONTINUATION = PreparedQuery(
    lambda p: HumanDecisionResolution.update(continuation_run_id=p.continuation).where(
        HumanDecisionResolution.decision == p.decision_id
    )
)
# A waiting run whose queue row is parked and whose claim nobody holds.
_PARKED_RUN = PreparedQuery(
    lambda p: (
        Run.select()
        .join(RunQueue, on=(RunQueue.run == Run.run_id))
        .join(Lease, on=(Lease.run == Run.run_id))
        .where(
            (Run.run_id == p.run_id)
            & (Run.status == "waiting")
            & (RunQueue.status == "parked")
            & (Lease.owner_id.is_null() | (Lease.expires_at <= p.now))
        )
    )
)
_QUEUE_DONE_FOR_CONTINUATION = PreparedQuery(
    lambda p: RunQueue.update(status="done", updated_at=p.now, finished_at=p.now).where(
        (RunQueue.run == p.run_id) & (RunQueue.status == "parked")
    )
)


def resolve(
    decision: HumanDecision,
    *,
    provenance: str,
    response: dict[str, Any] | None,
    channel: str | None = None,
    actor: str | None = None,
) -> Resolution:
    """Record the one winner of `decision`, or report the earlier winner.

    A repeat of the winning answer from the same source is `adopted`. An accepted answer
    also reserves the continuation run when the parent is parked (otherwise
    :func:`reserve_pending_continuations` does it once the parent parks).
    """
    row = _RESOLUTION.first(decision_id=decision.decision_id)
    if row is not None:
        existing = model_instance(HumanDecisionResolution, row)
        is_repeat = (
            existing.provenance == provenance
            and existing.channel == channel
            and existing.actor == actor
            and read_json(existing.response_hash) == response
        )
        return Resolution(
            is_repeat, is_repeat, resolution_json(existing), existing.continuation_run_id
        )
    stamp = now_ms()
    parent = parked_parent(decision.run_id) if response is not None else None
    continuation = continuation_id_for_decision(decision.decision_id) if parent else None
    # The primary key is the fence: a concurrent second insert fails and rolls back.
    statements.insert_row(
        HumanDecisionResolution,
        {
            "decision": decision.decision_id,
            "provenance": provenance,
            "channel": channel,
            "actor": actor,
            "response_hash": put_json(response) if response is not None else None,
            "continuation_run_id": continuation,
            "resolved_at": stamp,
        },
    )
    status = "cancelled" if provenance == PROVENANCE_CANCELLATION else "accepted"
    _SET_DECISION_STATUS.changed(status=status, now=stamp, decision_id=decision.decision_id)
    record_run_change(
        decision.run_id,
        event_type=f"human_decision.{status}",
        actor=f"{provenance}:{channel}" if channel else provenance,
        payload={"decisionId": decision.decision_id, "provenance": provenance},
    )
    cancel_pending_decision_messages(decision.run_id, decision.decision_id)
    if parent is not None and continuation is not None and response is not None:
        _reserve_decision_continuation(parent, decision.decision_id, response, continuation)
    winner: DecisionResolution = {
        "provenance": provenance,
        "channel": channel,
        "actor": actor,
        "response": response,
        "resolvedAt": iso_time(stamp),
        "continuationRunId": continuation,
    }
    return Resolution(True, False, winner, continuation)


def decision_status(winner: DecisionResolution) -> str:
    """The status a decision has once `winner` resolved it."""
    return "cancelled" if winner["provenance"] == PROVENANCE_CANCELLATION else "accepted"


def parked_parent(run_id: str) -> Run | None:
    """The run if it is waiting, its queue row parked and unowned: ready for its
    continuation; else None."""
    row = _PARKED_RUN.first(run_id=run_id, now=now_ms())
    return None if row is None else model_instance(Run, row)


_WINNING_RESPONSE = PreparedQuery(
    lambda p: (
        HumanDecisionResolution.select(
            HumanDecision.decision_id, HumanDecisionResolution.response_hash
        )
        .join(HumanDecision)
        .where(
            (HumanDecision.run == p.run_id)
            & (HumanDecision.node_id == p.node_id)
            & HumanDecisionResolution.response_hash.is_null(False)
        )
        .order_by(HumanDecision.created_at.desc())
        .limit(1)
    )
)


def winning_response(run_id: str, node_id: str) -> dict[str, Any] | None:
    """`{decisionId, response}`: the answer the run's latest decision at `node_id` took."""
    row = _WINNING_RESPONSE.first(run_id=run_id, node_id=node_id)
    if row is None:
        return None
    return {"decisionId": row[0], "response": read_json(row[1])}


def parent_is_parked(run_id: str) -> bool:
    return parked_parent(run_id) is not None


def _reserve_decision_continuation(
    parent: Run, decision_id: str, response: dict[str, Any], run_id: str
) -> None:
    reserve_continuation(
        parent,
        run_id,
        # A decision continuation keeps the parent's input; the answer is the node output.
        input=read_json(parent.input_hash),
        launch_options={"humanDecision": {"decisionId": decision_id, "response": response}},
        actor="decision",
    )


def reserve_continuation(
    parent: Run,
    run_id: str,
    *,
    input: Any,
    launch_options: dict[str, Any],
    actor: str,
) -> tuple[Run, bool]:
    """Create the continuation of a parked parent and retire the parent's queue row.

    The parent's queue row becomes `done`, so it is never resumed or continued twice; a
    retry with the same id adopts the continuation.
    """
    run, created = create_derived_run(
        parent,
        run_id=run_id,
        lineage_kind="continuation",
        input=input,
        actor=actor,
        launch_options=launch_options,
    )
    if created:
        _QUEUE_DONE_FOR_CONTINUATION.changed(run_id=parent.run_id, now=now_ms())
        record_run_change(
            parent.run_id,
            event_type="run.queue_done_for_continuation",
            actor=actor,
            payload={"continuationRunId": run_id},
            status_detail=f"Answered; continued by {run_id}",
        )
    return run, created


def _unreserved_continuations() -> Any:
    return (
        HumanDecisionResolution.select(HumanDecisionResolution, HumanDecision)
        .join(HumanDecision)
        .join(Run, on=(Run.run_id == HumanDecision.run))
        .where(
            HumanDecisionResolution.continuation_run_id.is_null()
            & HumanDecisionResolution.response_hash.is_null(False)
            # A parent that ended (e.g. cancelled) will never take its continuation.
            & (Run.status == "waiting")
        )
    )


def has_pending_continuations() -> bool:
    return bool(_unreserved_continuations().exists())


def reserve_pending_continuations() -> list[str]:
    """Continuations of accepted decisions whose parent was not parked yet at acceptance
    (a parent paused since waits for `run resume`)."""
    reserved = []
    for row in _unreserved_continuations():
        parent = parked_parent(row.decision.run_id)
        if parent is None or parent.paused:
            continue
        decision_id = row.decision.decision_id
        run_id = continuation_id_for_decision(decision_id)
        _reserve_decision_continuation(parent, decision_id, read_json(row.response_hash), run_id)
        _SET_CONTINUATION.changed(continuation=run_id, decision_id=decision_id)
        reserved.append(run_id)
    return reserved


def expired_decisions(now: int) -> list[HumanDecision]:
    """Pending decisions with a default whose deadline has passed, oldest deadline first;
    not those of a paused run (their clock is stopped until `run resume`)."""
    return list(
        HumanDecision.select(HumanDecision)
        .join(Run, on=(Run.run_id == HumanDecision.run))
        .where(
            (HumanDecision.status == "pending")
            & HumanDecision.deadline_at.is_null(False)
            & (HumanDecision.deadline_at <= now)
            & HumanDecision.default_response_hash.is_null(False)
            & ~Run.paused
        )
        .order_by(HumanDecision.deadline_at, HumanDecision.decision_id)
    )


def give_back_pause(run_id: str, now: int) -> None:
    """`run resume`: the run's pending decisions get their paused time back on their
    deadlines, so a default never wins for time nobody could answer in."""
    paused_at = paused_since(run_id)
    if paused_at is not None and now > paused_at:
        HumanDecision.update(deadline_at=HumanDecision.deadline_at + (now - paused_at)).where(
            (HumanDecision.run == run_id)
            & (HumanDecision.status == "pending")
            & HumanDecision.deadline_at.is_null(False)
        ).execute()


# By run first: a run's messages are indexed, their source ids are not.
_CANCEL_DECISION_MESSAGES = PreparedQuery(
    lambda p: WorkflowMessage.update(status="cancelled", updated_at=p.now).where(
        (WorkflowMessage.run == p.run_id)
        & (WorkflowMessage.kind == "decision")
        & (WorkflowMessage.source_id == p.decision_id)
        & (WorkflowMessage.status == "pending")
    )
)


def cancel_pending_decision_messages(run_id: str, decision_id: str) -> int:
    """The session's decision message (of the decision's run) is moot once the decision
    is resolved."""
    return _CANCEL_DECISION_MESSAGES.changed(run_id=run_id, decision_id=decision_id, now=now_ms())


# --- listing ------------------------------------------------------------------------------


def decision_json(decision: HumanDecision) -> dict[str, Any]:
    """The `decision list --json` object of SPEC §13."""
    record = public_request(decision)
    row = _RESOLUTION.first(decision_id=decision.decision_id)
    resolution = None if row is None else model_instance(HumanDecisionResolution, row)
    return {
        "decisionId": decision.decision_id,
        "runId": decision.run_id,
        "nodeId": decision.node_id,
        "audience": decision.audience,
        "title": record["title"],
        "choices": record["choices"],
        "status": decision.status,
        "deadline": iso_time(decision.deadline_at),
        "defaultResponse": read_json(decision.default_response_hash),
        "resolution": resolution_json(resolution) if resolution else None,
    }


def list_decisions(*, include_resolved: bool = False, limit: int = 100) -> list[dict[str, Any]]:
    query = HumanDecision.select().order_by(
        HumanDecision.created_at.desc(), HumanDecision.decision_id
    )
    if not include_resolved:
        query = query.where(HumanDecision.status == "pending")
    return [decision_json(decision) for decision in query.limit(limit)]


def checkpoint_state(run: Run) -> dict[str, Any] | None:
    """The run's state when it waits at a plain checkpoint step, else None."""
    state = read_json(run.state_hash) or {}
    waiting_on = state.get("waitingOn")
    if state.get("status") != "waiting" or waiting_on is None:
        return None
    is_checkpoint = any(
        step.get("nodeId") == waiting_on and step.get("nodeType") == "checkpoint"
        for step in state.get("steps", [])
    )
    return state if is_checkpoint else None


# --- channel effects ----------------------------------------------------------------------
#
# Every delivery to and settlement on a channel is an `effects` row (scope `channel`,
# no run: a channel effect must never block or park the run it is about). Its id is
# derived from (decision, channel, purpose), so each happens at most once per attempt.

CHANNEL_EFFECT_TYPES = {"delivery": "channel.delivery", "settlement": "channel.settlement"}
MAX_AUTOMATIC_ATTEMPTS = 3
RETRY_DELAY_MS = 1_000
_FINISHED_SETTLEMENT = ("applied", "ambiguous", "cancelled")


_CHANNEL_EFFECT = PreparedQuery(lambda p: Effect.select().where(Effect.effect_id == p.effect_id))
_RETRY_CHANNEL_EFFECT = PreparedQuery(
    lambda p: Effect.update(
        status="applying",
        attempt_count=p.attempts + 1,
        next_attempt_at=None,
        updated_at=p.now,
    ).where(
        (Effect.effect_id == p.effect_id)
        & (Effect.status == "rejected")
        & (Effect.attempt_count == p.attempts)
    )
)
_FINISH_CHANNEL_EFFECT = PreparedQuery(
    lambda p: Effect.update(
        status=p.outcome,
        result_hash=p.result_hash,
        error_hash=p.error_hash,
        next_attempt_at=p.retry_at,
        settled_at=p.now,
        updated_at=p.now,
    ).where(
        (Effect.effect_id == p.effect_id)
        & (Effect.status == "applying")
        & (Effect.attempt_count == p.attempt)
    )
)


def _channel_effect(effect_id: str) -> Effect | None:
    row = _CHANNEL_EFFECT.first(effect_id=effect_id)
    return None if row is None else model_instance(Effect, row)


def channel_effect_key(decision_id: str, channel: str) -> str:
    return f"{decision_id}|{channel}"


def channel_effect_id(decision_id: str, channel: str, purpose: str) -> str:
    basis = {"decisionId": decision_id, "channel": channel, "purpose": purpose}
    return "effect-" + digest(basis)[:40]


def begin_channel_effect(decision_id: str, channel: str, purpose: str, now: int) -> int | None:
    """Start the next automatic attempt of a delivery or settlement; returns its number.

    None when the effect is done, in flight, ambiguous (an operator decides), out of
    automatic attempts, or waiting for its retry time.
    """
    effect_id = channel_effect_id(decision_id, channel, purpose)
    effect = _channel_effect(effect_id)
    return _begin_attempt(effect_id, effect, decision_id, channel, purpose, now)


def _begin_attempt(
    effect_id: str,
    effect: Effect | None,
    decision_id: str,
    channel: str,
    purpose: str,
    now: int,
    payload_hash: str | None = None,
) -> int | None:
    if not _is_due(effect, now):
        return None
    if effect is None:
        _create_channel_effect(
            effect_id, decision_id, channel, purpose, "applying", now, payload_hash
        )
        return 1
    changed = _RETRY_CHANNEL_EFFECT.changed(
        effect_id=effect_id, attempts=effect.attempt_count, now=now
    )
    return effect.attempt_count + 1 if changed == 1 else None


_CHANNEL_EFFECT_PAIR = PreparedQuery(
    lambda p: Effect.select().where(
        (Effect.effect_id == p.delivery) | (Effect.effect_id == p.settlement)
    )
)


def begin_settlement(decision_id: str, channel: str, now: int, *, call: bool) -> int | None:
    """Settle a resolved decision on `channel` if its delivery was applied and the
    settlement is due (the answer's own transaction calls this for each channel).

    A channel with nothing to take back (`call` False: it has no `settle`) is recorded
    settled at once; otherwise the settlement's next attempt begins and its number comes
    back for the call. None when there is no call to make.
    """
    delivery_id = channel_effect_id(decision_id, channel, "delivery")
    settlement_id = channel_effect_id(decision_id, channel, "settlement")
    found = {
        effect.effect_id: effect
        for effect in (
            model_instance(Effect, row)
            for row in _CHANNEL_EFFECT_PAIR.rows(delivery=delivery_id, settlement=settlement_id)
        )
    }
    delivery, settlement = found.get(delivery_id), found.get(settlement_id)
    if delivery is None or delivery.status != "applied":
        return None  # nothing reached the channel yet; the poll settles what arrives later
    if not call:
        if settlement is None:
            # The same payload as the delivery's: {decisionId, channel}.
            _create_channel_effect(
                settlement_id,
                decision_id,
                channel,
                "settlement",
                "applied",
                now,
                delivery.payload_hash,
            )
        return None
    return _begin_attempt(
        settlement_id, settlement, decision_id, channel, "settlement", now, delivery.payload_hash
    )


def record_without_call(decision_id: str, channel: str, purpose: str, now: int) -> bool:
    """Record as applied the delivery or settlement of a channel that has nothing to do
    for it (no `deliver`, or no `settle`); False when that effect is recorded already."""
    effect_id = channel_effect_id(decision_id, channel, purpose)
    if _channel_effect(effect_id) is not None:
        return False
    _create_channel_effect(effect_id, decision_id, channel, purpose, "applied", now)
    return True


def _create_channel_effect(
    effect_id: str,
    decision_id: str,
    channel: str,
    purpose: str,
    status: str,
    now: int,
    payload_hash: str | None = None,
) -> None:
    statements.insert_row(
        Effect,
        {
            "effect_id": effect_id,
            "run": None,
            "scope": "channel",
            "effect_type": CHANNEL_EFFECT_TYPES[purpose],
            "idempotency_key": channel_effect_key(decision_id, channel),
            "policy": "manual",
            "payload_hash": payload_hash
            or put_json({"decisionId": decision_id, "channel": channel}),
            "status": status,
            "attempt_count": 1,
            "created_at": now,
            "updated_at": now,
            "settled_at": now if status == "applied" else None,
        },
    )


def _is_due(effect: Effect | None, now: int) -> bool:
    return effect is None or (
        effect.status == "rejected"
        and effect.attempt_count < MAX_AUTOMATIC_ATTEMPTS
        and (effect.next_attempt_at or 0) <= now
    )


def channel_effect_is_due(decision_id: str, channel: str, purpose: str, now: int) -> bool:
    """A read-only check, so an idle poll tick needs no write transaction."""
    effect_id = channel_effect_id(decision_id, channel, purpose)
    return _is_due(_channel_effect(effect_id), now)


def finish_channel_effect(
    effect_id: str, attempt: int, outcome: str, *, result: Any = None, error: str | None = None
) -> bool:
    """Settle the in-flight attempt: `applied`, `rejected` or `ambiguous`. A rejected one
    keeps when it is retried (`next_attempt_at`); after the last automatic attempt it has
    none: it gave up, and only `effects retry` sends it again."""
    now = now_ms()
    retrying = outcome == "rejected" and attempt < MAX_AUTOMATIC_ATTEMPTS
    retry_at = now + RETRY_DELAY_MS * attempt if retrying else None
    changed = _FINISH_CHANNEL_EFFECT.changed(
        outcome=outcome,
        result_hash=put_json(result) if outcome == "applied" else None,
        error_hash=put_json({"error": error}) if error else None,
        retry_at=retry_at,
        now=now,
        effect_id=effect_id,
        attempt=attempt,
    )
    return changed == 1


def mark_interrupted_channel_effects(in_flight: set[str]) -> int:
    """When a host takes the channel duty: an attempt left `applying` by another runner
    (not one of `in_flight`) may or may not have reached its channel."""
    query = Effect.update(
        status="ambiguous",
        error_hash=put_json({"error": "host restarted without a receipt"}),
        updated_at=now_ms(),
    ).where((Effect.scope == "channel") & (Effect.status == "applying"))
    if in_flight:
        query = query.where(Effect.effect_id.not_in(sorted(in_flight)))
    marked: int = query.execute()
    return marked


def delivery_result(decision_id: str, channel: str) -> Any:
    effect = _channel_effect(channel_effect_id(decision_id, channel, "delivery"))
    return read_json(effect.result_hash) if effect is not None else None


def deliveries_to_settle() -> list[tuple[HumanDecision, str]]:
    """(resolved decision, channel) pairs whose delivery succeeded but is not settled."""
    settled = Effect.select(Effect.idempotency_key).where(
        (Effect.effect_type == CHANNEL_EFFECT_TYPES["settlement"])
        & (
            Effect.status.in_(_FINISHED_SETTLEMENT)
            | ((Effect.status == "rejected") & (Effect.attempt_count >= MAX_AUTOMATIC_ATTEMPTS))
        )
    )
    rows = Effect.select(Effect.idempotency_key).where(
        (Effect.effect_type == CHANNEL_EFFECT_TYPES["delivery"])
        & (Effect.status == "applied")
        & Effect.idempotency_key.not_in(settled)
    )
    pairs = []
    for row in rows:
        decision_id, channel = row.idempotency_key.split("|", 1)
        decision = HumanDecision.get_or_none(HumanDecision.decision_id == decision_id)
        if decision is not None and decision.status != "pending":
            pairs.append((decision, channel))
    return pairs


def delivery_gave_up(effect: Effect) -> bool:
    """A channel effect whose automatic attempts all failed: only an operator retries it."""
    return (
        effect.scope == "channel"
        and effect.status == "rejected"
        and effect.attempt_count >= MAX_AUTOMATIC_ATTEMPTS
    )


def channel_effects_needing_an_operator() -> dict[str, list[str]]:
    """Channel effects in doubt (`ambiguous`) and deliveries that gave up (`gaveUp`)."""
    rows = Effect.select().where(
        (Effect.scope == "channel") & Effect.status.in_(("ambiguous", "rejected"))
    )
    found: dict[str, list[str]] = {"ambiguous": [], "gaveUp": []}
    for effect in rows:
        if effect.status == "ambiguous":
            found["ambiguous"].append(effect.effect_id)
        elif delivery_gave_up(effect):
            found["gaveUp"].append(effect.effect_id)
    return found


def recover_channel_effect(effect_id: str, action: str) -> dict[str, Any]:
    """An operator's verdict on an ambiguous effect: `confirm` it happened, or `retry` it."""
    effect = Effect.get_or_none((Effect.effect_id == effect_id) & (Effect.scope == "channel"))
    if effect is None:
        raise NotFoundError(f"Channel effect {effect_id} does not exist.")
    if effect.status != "ambiguous" and not (action == "retry" and delivery_gave_up(effect)):
        raise ConflictError(
            f"Channel effect {effect_id} is {effect.status}; only an ambiguous effect or a "
            "delivery that gave up needs recovery."
        )
    now = now_ms()
    if action == "confirm":
        Effect.update(status="applied", settled_at=now, updated_at=now).where(
            Effect.effect_id == effect_id
        ).execute()
    elif action == "retry":
        # One more automatic attempt, explicitly allowed by the operator.
        Effect.update(
            status="rejected",
            attempt_count=min(effect.attempt_count, MAX_AUTOMATIC_ATTEMPTS - 1),
            next_attempt_at=now,
            updated_at=now,
        ).where(Effect.effect_id == effect_id).execute()
    else:
        raise InvalidInputError("A channel effect recovery is 'confirm' or 'retry'.")
    return {"effectId": effect_id, "action": action}
