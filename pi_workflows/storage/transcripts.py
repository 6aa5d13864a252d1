"""Reading back agent transcripts: what the agent did in each attempt of a run.

An executor fills an `AgentTranscript` during an agent attempt. While the attempt runs, the
engine saves its new entries in chunks (`partial` records); when the attempt ends in its
worker, the whole transcript (`run_state.record_transcript`: the entries as a blob, one
`agent.transcript_recorded` event naming the node and attempt). An attempt whose worker was
stopped first — cancel, pause, a killed worker — has only its chunks: they are joined, and
an `ended` entry says the rest was not saved.
"""

from __future__ import annotations

from typing import Any

from ..event_types import EventType
from .blobs import read_json
from .models import TERMINAL_RUN_STATUSES, Event, NodeAttempt, Run
from .runs import get_run

UNSAVED_END = (
    "the worker was stopped before the attempt ended; what the agent did after the last "
    "save (at most 2 s earlier) was not kept"
)


def attempt_transcripts(run_id: str, node_id: str | None = None) -> list[dict[str, Any]]:
    """The run's transcripts in attempt order: ``{nodeId, attemptId, attemptNumber,
    outcome, recordedAt, complete, entries}``; only node `node_id`'s when given.
    ``complete`` is false for an attempt whose worker stopped before saving it whole.
    """
    run = get_run(run_id)
    events = (
        Event.select()
        .where((Event.run == run_id) & (Event.event_type == EventType.AGENT_TRANSCRIPT_RECORDED))
        .order_by(Event.revision)
    )
    records: dict[str, list[tuple[Event, dict[str, Any]]]] = {}
    for event in events:
        payload = read_json(event.payload_hash)
        if node_id is None or payload["nodeId"] == node_id:
            records.setdefault(payload["attemptId"], []).append((event, payload))
    attempts = {
        row.attempt_id: row
        for row in NodeAttempt.select().where(NodeAttempt.attempt_id.in_(list(records)))
    }
    return [_transcript(records[key], attempts.get(key), run) for key in records]


def _transcript(
    records: list[tuple[Event, dict[str, Any]]], attempt: NodeAttempt | None, run: Run
) -> dict[str, Any]:
    whole = [record for record in records if not record[1].get("partial")]
    if whole:
        event, payload = whole[-1]
        entries = read_json(payload["transcriptHash"])
    else:
        event, payload = records[-1]
        entries = [entry for _, chunk in records for entry in read_json(chunk["transcriptHash"])]
        if _stopped(attempt, run):
            ended: dict[str, Any] = {"kind": "ended", "at": event.recorded_at}
            if attempt is not None and attempt.finished_at is not None:
                ended["at"] = attempt.finished_at
            ended["reason"] = "cancel" if attempt and attempt.status == "cancelled" else "stopped"
            entries.append({**ended, "text": UNSAVED_END})
    return {
        "nodeId": payload["nodeId"],
        "attemptId": payload["attemptId"],
        "attemptNumber": attempt.attempt_number if attempt else None,
        "outcome": attempt.status if attempt else None,
        "recordedAt": event.recorded_at,
        "complete": bool(whole),
        "entries": entries,
    }


def _stopped(attempt: NodeAttempt | None, run: Run) -> bool:
    """Has this attempt ended without its worker saving it (rather than still running)?"""
    if attempt is None or attempt.status not in ("pending", "running", "waiting"):
        return True
    return bool(run.paused) or run.status in TERMINAL_RUN_STATUSES
