"""Reading the immutable event history of runs (one event per run revision)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import peewee

from .blobs import read_json
from .models import Event, Run
from .prepared import tuple_rows


@dataclass(frozen=True)
class EventRecord:
    """One recorded run change, as plugins and commands see it."""

    run_id: str
    revision: int
    event_type: str
    actor: str
    lease_generation: int | None
    payload: Any
    recorded_at: int

    def to_json(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "revision": self.revision,
            "type": self.event_type,
            "actor": self.actor,
            "leaseGeneration": self.lease_generation,
            "payload": self.payload,
            "recordedAt": self.recorded_at,
        }


def run_events(run_id: str | None = None) -> list[EventRecord]:
    """Events of one run in revision order, or of every run in recording order."""
    query = Event.select()
    if run_id is not None:
        query = query.where(Event.run == run_id).order_by(Event.revision)
    else:
        query = query.order_by(Event.event_seq)
    return [
        EventRecord(
            run_id=event.run_id,
            revision=event.revision,
            event_type=event.event_type,
            actor=event.actor,
            lease_generation=event.lease_generation,
            payload=read_json(event.payload_hash),
            recorded_at=event.recorded_at,
        )
        for event in query
    ]


def event_counts() -> dict[str, int]:
    """How many events of each type the store holds."""
    query = Event.select(Event.event_type, peewee.fn.COUNT("*").alias("count")).group_by(
        Event.event_type
    )
    return {event_type: count for event_type, count in tuple_rows(query)}


def run_exists(run_id: str) -> bool:
    return Run.select().where(Run.run_id == run_id).exists()
