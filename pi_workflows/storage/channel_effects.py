"""Channel effects (SPEC §11): every delivery of a human decision to a channel and every
settlement on one is an `effects` row (scope `channel`, no run: a channel effect must never
block or park the run it is about). Its id is derived from (decision, channel, purpose),
so each happens at most once per attempt. Call these functions inside
``StateStore.transaction()``.
"""

from __future__ import annotations

from typing import Any

from ..canonical import digest
from ..clock import now_ms
from ..errors import ConflictError, InvalidInputError, NotFoundError
from . import statements
from .blobs import put_json, read_json
from .models import Effect, HumanDecision
from .prepared import PreparedQuery, model_instance

CHANNEL_EFFECT_TYPES = {"delivery": "channel.delivery", "settlement": "channel.settlement"}
# A channel's delivery policy when channels.toml gives it none (`delivery_attempts`,
# `retry_delay_ms`): attempts in all, and the wait before retry n (n times the delay).
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
    # A rejected attempt that will be retried keeps its retry time; one that gave up has
    # none (`finish_channel_effect`).
    return effect is None or (
        effect.status == "rejected"
        and effect.next_attempt_at is not None
        and effect.next_attempt_at <= now
    )


def channel_effect_is_due(decision_id: str, channel: str, purpose: str, now: int) -> bool:
    """A read-only check, so an idle poll tick needs no write transaction."""
    effect_id = channel_effect_id(decision_id, channel, purpose)
    return _is_due(_channel_effect(effect_id), now)


def finish_channel_effect(
    effect_id: str,
    attempt: int,
    outcome: str,
    *,
    result: Any = None,
    error: str | None = None,
    attempts: int = MAX_AUTOMATIC_ATTEMPTS,
    retry_delay_ms: int = RETRY_DELAY_MS,
) -> bool:
    """Settle the in-flight attempt: `applied`, `rejected` or `ambiguous`. A rejected one
    keeps when it is retried (`next_attempt_at`, `retry_delay_ms` times the attempt's
    number later); after attempt number `attempts` it has none: it gave up, and only
    `effects retry` sends it again. False when the attempt was not the one in flight."""
    now = now_ms()
    retrying = outcome == "rejected" and attempt < attempts
    retry_at = now + retry_delay_ms * attempt if retrying else None
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


_DELIVERIES_NOT_SETTLED = PreparedQuery(
    lambda p: Effect.select(Effect.idempotency_key).where(
        (Effect.effect_type == CHANNEL_EFFECT_TYPES["delivery"])
        & (Effect.status == "applied")
        & Effect.idempotency_key.not_in(
            Effect.select(Effect.idempotency_key).where(
                (Effect.effect_type == CHANNEL_EFFECT_TYPES["settlement"])
                & (
                    Effect.status.in_(_FINISHED_SETTLEMENT)
                    | ((Effect.status == "rejected") & Effect.next_attempt_at.is_null())
                )
            )
        )
    )
)


def deliveries_to_settle() -> list[tuple[HumanDecision, str]]:
    """(resolved decision, channel) pairs whose delivery succeeded but is not settled
    (the channel runner asks at every poll)."""
    pairs = []
    for (key,) in _DELIVERIES_NOT_SETTLED.rows():
        decision_id, channel = key.split("|", 1)
        decision = HumanDecision.get_or_none(HumanDecision.decision_id == decision_id)
        if decision is not None and decision.status != "pending":
            pairs.append((decision, channel))
    return pairs


def delivery_gave_up(effect: Effect) -> bool:
    """A channel effect whose automatic attempts all failed: only an operator retries it."""
    return (
        effect.scope == "channel" and effect.status == "rejected" and effect.next_attempt_at is None
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
        # One more attempt, explicitly allowed by the operator: past its channel's
        # attempts, it gives up again if it fails.
        Effect.update(status="rejected", next_attempt_at=now, updated_at=now).where(
            Effect.effect_id == effect_id
        ).execute()
    else:
        raise InvalidInputError("A channel effect recovery is 'confirm' or 'retry'.")
    return {"effectId": effect_id, "action": action}
