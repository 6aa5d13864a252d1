"""Effects in doubt and their recovery (SPEC §7.4, §7.4a).

An effect left `applying` when its worker stopped may have happened. Exit recovery
sends an idempotent one back to `pending` (its node runs again) and makes a manual one
`ambiguous`: the run waits until an operator confirms it (it happened; the node
completes with the given result) or retries it (it did not; the node runs it again).
Channel effects of decisions (scope `channel`, no run) are resolved the same way.
Call these inside ``StateStore.transaction()``.
"""

from __future__ import annotations

from typing import Any

from ..clock import now_ms
from ..errors import ConflictError, InvalidInputError, NotFoundError
from ..event_types import EventType
from . import channel_effects
from .blobs import put_json, put_text, read_json, read_text
from .models import TERMINAL_RUN_STATUSES, Effect, Run, RunQueue
from .prepared import PreparedQuery
from .revisions import record_run_change

AMBIGUOUS_CODE = "effectAmbiguous"
# Marks the stored request of a run effect an operator confirmed or retried (see `resolve`).
VERDICT_KEY = "operatorVerdict"
EFFECT_STATUSES = ("pending", "applying", "applied", "rejected", "ambiguous", "cancelled")
LIST_LIMIT = 500


def resolution_hint(effect_id: str) -> str:
    """The commands that resolve an effect in doubt, as an operator types them."""
    return (
        f"run 'pi-workflows effects confirm {effect_id} [--result-json JSON]' if it happened, "
        f"or 'pi-workflows effects retry {effect_id}' if it did not"
    )


def recover_interrupted(run_id: str, generation: int | None = None) -> list[str]:
    """Exit recovery, step 1: settle the run's effects left `applying`.

    Idempotent ones go back to `pending`, manual ones become `ambiguous`. Returns the ids
    of the effects now ambiguous (those of earlier exits included).
    """
    applying = list(
        Effect.select(Effect.effect_id, Effect.policy).where(
            (Effect.run == run_id) & (Effect.status == "applying")
        )
    )
    if applying:
        stamp = now_ms()
        reason = put_text("its worker stopped while the action ran")
        for policy, status in (("idempotent", "pending"), ("manual", "ambiguous")):
            Effect.update(status=status, error_hash=reason, updated_at=stamp).where(
                (Effect.run == run_id) & (Effect.status == "applying") & (Effect.policy == policy)
            ).execute()
        record_run_change(
            run_id,
            event_type=EventType.EFFECT_RECOVERED,
            actor="host",
            payload={
                "pending": [e.effect_id for e in applying if e.policy == "idempotent"],
                "ambiguous": [e.effect_id for e in applying if e.policy == "manual"],
            },
            lease_generation=generation,
        )
    return ambiguous_effect_ids(run_id)


_UNSETTLED = PreparedQuery(
    lambda p: (
        Effect.select(Effect.effect_id)
        .where((Effect.run == p.run_id) & Effect.status.in_(("applying", "ambiguous")))
        .limit(1)
    ),
    planned=True,
)


def has_unsettled(run_id: str) -> bool:
    """Whether the run has an effect left `applying` or in doubt (a read only)."""
    return _UNSETTLED.exists(run_id=run_id)


def judged_by_operator(effect: Effect) -> bool:
    """Whether an operator's verdict (`effects confirm|retry`) replaced the effect's request.

    The node's next reservation of it then takes the verdict whatever it requests.
    """
    payload = read_json(effect.payload_hash) if effect.payload_hash is not None else None
    return isinstance(payload, dict) and VERDICT_KEY in payload


def ambiguous_effect_ids(run_id: str) -> list[str]:
    return [
        row.effect_id
        for row in Effect.select(Effect.effect_id)
        .where((Effect.run == run_id) & (Effect.status == "ambiguous"))
        .order_by(Effect.created_at)
    ]


def ambiguous_detail(effect_ids: list[str]) -> str:
    """The status detail of a run parked for effects in doubt (`run status`, `run why`)."""
    first = effect_ids[0]
    more = f" (and {len(effect_ids) - 1} more)" if len(effect_ids) > 1 else ""
    return f"Effect {first}{more} may or may not have happened; {resolution_hint(first)}."


def describe(effect: Effect) -> dict[str, Any]:
    """One effect as operators see it (`effects list --json`); never its payload."""
    node_id = decision_id = channel = None
    if effect.scope == "channel":
        decision_id, channel = effect.idempotency_key.split("|", 1)
    elif effect.payload_hash is not None:
        payload = read_json(effect.payload_hash)
        node_id = payload.get("nodeId") if isinstance(payload, dict) else None
    error = None
    if effect.scope == "channel" and effect.error_hash is not None:
        error = (read_json(effect.error_hash) or {}).get("error")  # stored as {"error": text}
    elif effect.error_hash is not None:
        error = read_text(effect.error_hash)
    return {
        "effectId": effect.effect_id,
        "scope": effect.scope,
        "runId": effect.run_id,
        "nodeId": node_id,
        "decisionId": decision_id,
        "channel": channel,
        "effectType": effect.effect_type,
        "policy": effect.policy,
        "status": effect.status,
        "attempts": effect.attempt_count,
        # A rejected channel effect is either retried at `nextAttemptAt` or gave up
        # (only `effects retry` sends it again).
        "nextAttemptAt": effect.next_attempt_at if effect.status == "rejected" else None,
        "gaveUp": channel_effects.delivery_gave_up(effect),
        "error": error,
        "createdAt": effect.created_at,
        "updatedAt": effect.updated_at,
    }


def list_effects(*, status: str | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
    """Effects newest first, optionally only those with `status` or of one run."""
    query = Effect.select().order_by(Effect.created_at.desc()).limit(LIST_LIMIT)
    if status is not None:
        if status not in EFFECT_STATUSES:
            raise InvalidInputError(f"An effect status is one of {', '.join(EFFECT_STATUSES)}.")
        query = query.where(Effect.status == status)
    if run_id is not None:
        query = query.where(Effect.run == run_id)
    return [describe(effect) for effect in query]


def _recoverable_effect(effect_id: str, action: str) -> Effect:
    effect = Effect.get_or_none(Effect.effect_id == effect_id)
    if effect is None:
        raise NotFoundError(
            f"Effect {effect_id} does not exist; list them with 'pi-workflows effects list'."
        )
    retryable = action == "retry" and channel_effects.delivery_gave_up(effect)
    if effect.status != "ambiguous" and not retryable:
        raise ConflictError(
            f"Effect {effect_id} is {effect.status}; only an effect in doubt (ambiguous) can be "
            "confirmed or retried, and a channel delivery that gave up can be retried."
        )
    return effect


def resolve(effect_id: str, action: str, result: Any, actor: str) -> dict[str, Any]:
    """An operator's verdict on an effect in doubt: `confirm` (with `result`) or `retry`.

    A run effect's run becomes claimable again once none of its effects is in doubt;
    the receipt says so in `runReleased`.
    """
    if action not in ("confirm", "retry"):
        raise InvalidInputError("An effect is resolved by 'confirm' or 'retry'.")
    effect = _recoverable_effect(effect_id, action)
    if effect.scope == "channel":
        channel_effects.recover_channel_effect(effect_id, action)
        return {"effectId": effect_id, "action": action, "runId": None, "runReleased": False}
    stamp = now_ms()
    # The verdict is about this effect, not about one request: a node whose request
    # differs on each attempt (an attempt id in its command) must still get it.
    judged = put_json({"nodeId": describe(effect)["nodeId"], VERDICT_KEY: action})
    if action == "confirm":
        Effect.update(
            status="applied",
            payload_hash=judged,
            result_hash=put_json(result),
            error_hash=None,
            settled_at=stamp,
            updated_at=stamp,
        ).where(Effect.effect_id == effect_id).execute()
    else:
        Effect.update(
            status="pending", payload_hash=judged, error_hash=None, updated_at=stamp
        ).where(Effect.effect_id == effect_id).execute()
    run_id = effect.run_id
    assert run_id is not None  # a run effect: channel effects, run-less, returned above
    is_terminal = Run.get_by_id(run_id).status in TERMINAL_RUN_STATUSES
    released = not is_terminal and not ambiguous_effect_ids(run_id)
    updates: dict[str, Any] = {}
    if released:
        RunQueue.update(
            error_code=None, error_hash=None, available_at=stamp, updated_at=stamp
        ).where((RunQueue.run == run_id) & (RunQueue.error_code == AMBIGUOUS_CODE)).execute()
        if Run.get_by_id(run_id).status == "waiting":
            updates = {"status": "running", "status_detail": None}
    revision = record_run_change(
        run_id,
        event_type=EventType.EFFECT_CONFIRMED if action == "confirm" else EventType.EFFECT_RETRIED,
        actor=actor,
        payload={"effectId": effect_id},
        **updates,
    )
    return {
        "effectId": effect_id,
        "action": action,
        "runId": run_id,
        "runReleased": released,
        "revision": revision,
    }
