"""The database side of human decisions' requests (SPEC §11): each decision's immutable,
content-addressed request record, its deterministic ids, its resolution as stored, and the
`decision list` view. Resolving a decision is `decision_resolutions`; the channels'
deliveries and settlements are `channel_effects`. Call these functions inside
``StateStore.transaction()``.
"""

from __future__ import annotations

import datetime
from typing import Any, cast, overload

from ..canonical import digest
from ..clock import now_ms
from ..errors import ConflictError, InvalidInputError, NotFoundError
from ..records import ChannelRequest, DecisionResolution
from . import statements
from .blobs import put_json, read_json
from .decision_presentation import checked_text, normalize_presentation, validate_response
from .models import HumanDecision as HumanDecision
from .models import HumanDecisionResolution, Run
from .prepared import PreparedQuery, model_instance
from .runs import get_run

REQUEST_SCHEMA = "pi-workflows.human-decision-request.v1"
CHANNEL_REQUEST_SCHEMA = "pi-workflows.human-decision-channel-request.v1"

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
    title = checked_text(request.get("title"), "The decision title")
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


_PENDING_DECISIONS = PreparedQuery(
    lambda p: HumanDecision.select().where(HumanDecision.status == "pending")
)


def pending_decisions() -> list[HumanDecision]:
    """Every decision still waiting for its answer (the channel runner asks at every poll)."""
    return _PENDING_DECISIONS.models(HumanDecision)


def pending_decision(run_id: str) -> HumanDecision | None:
    """A decision of the run still waiting for its answer."""
    decision: HumanDecision | None = (
        HumanDecision.select()
        .where((HumanDecision.run == run_id) & (HumanDecision.status == "pending"))
        .first()
    )
    return decision


# --- resolutions as stored ---------------------------------------------------------------


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


def stored_resolution(decision_id: str) -> HumanDecisionResolution | None:
    """The decision's resolution, once it has one."""
    row = _RESOLUTION.first(decision_id=decision_id)
    return None if row is None else model_instance(HumanDecisionResolution, row)


# --- listing ------------------------------------------------------------------------------


def decision_json(decision: HumanDecision) -> dict[str, Any]:
    """The `decision list --json` object of SPEC §13."""
    record = public_request(decision)
    resolution = stored_resolution(decision.decision_id)
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
