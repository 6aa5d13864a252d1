"""A run's progress as a follower sees it (`run watch`): node attempts, published updates
and run transitions, read from the event history after a given revision.

Entries are small on purpose — no node outputs, texts cut short — so a watch event stays
far below the protocol's frame limit however large the run's values are.
"""

from __future__ import annotations

from typing import Any

from ..canonical import canonical_json
from ..event_types import NODE_ENDS, TRACE_RUN_EVENTS, EventType
from ..protocol.client_messages import ProgressKind
from .blobs import read_json
from .models import Event

MAX_TEXT_CHARS = 300
MAX_ENTRIES = 200


def _short(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


def progress_after(run_id: str, revision: int) -> tuple[list[dict[str, Any]], int]:
    """Progress entries of events after `revision`; returns them and the last revision read.

    At most `MAX_ENTRIES` events are read per call; call again from the returned revision.
    """
    rows = list(
        Event.select(Event.revision, Event.event_type, Event.payload_hash, Event.recorded_at)
        .where((Event.run == run_id) & (Event.revision > revision))
        .order_by(Event.revision)
        .limit(MAX_ENTRIES)
    )
    entries = [
        entry
        for row in rows
        if (entry := _entry(row.event_type, row.payload_hash, row.recorded_at)) is not None
    ]
    return entries, (rows[-1].revision if rows else revision)


def _entry(event_type: str, payload_hash: str, recorded_at: int) -> dict[str, Any] | None:
    if event_type == EventType.NODE_STARTED:
        trace = read_json(payload_hash)
        return {
            "kind": ProgressKind.NODE_STARTED,
            "at": trace.get("at", recorded_at),
            "nodeId": trace.get("nodeId"),
            "attemptId": trace.get("attemptId"),
            "nodeType": trace.get("payload", {}).get("nodeType"),
        }
    if event_type in NODE_ENDS:
        trace = read_json(payload_hash)
        step = trace.get("payload", {})
        entry = {
            "kind": ProgressKind.NODE_ENDED,
            "at": trace.get("at", recorded_at),
            "nodeId": trace.get("nodeId"),
            "attemptId": trace.get("attemptId"),
            "outcome": step.get("outcome"),
            "startedAt": step.get("startedAt"),
            "finishedAt": step.get("finishedAt"),
            "durationMs": step.get("durationMs"),
        }
        if step.get("error"):
            entry["error"] = _short(str(step["error"]))
        return entry
    if event_type == EventType.UPDATE_PUBLISHED:
        update = read_json(payload_hash)
        return {
            "kind": ProgressKind.UPDATE,
            "at": recorded_at,
            "nodeId": update.get("nodeId"),
            "type": update.get("type"),
            "key": update.get("key"),
            "data": _short(canonical_json(update.get("data"))),
        }
    if event_type in TRACE_RUN_EVENTS:
        return {"kind": ProgressKind.RUN, "at": recorded_at, "event": event_type}
    return None
