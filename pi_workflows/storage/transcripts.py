"""Reading back agent transcripts: what the agent did in each attempt of a run.

An executor fills an `AgentTranscript` during an agent attempt; the engine stores it when
the attempt ends (`run_state.record_transcript`: the entries as a blob, one
`agent_transcript_recorded` event naming the node and attempt).
"""

from __future__ import annotations

from typing import Any

from .blobs import read_json
from .models import Event, NodeAttempt
from .run_state import TRANSCRIPT_EVENT
from .runs import get_run


def attempt_transcripts(run_id: str, node_id: str | None = None) -> list[dict[str, Any]]:
    """The run's transcripts in attempt order: ``{nodeId, attemptId, attemptNumber,
    outcome, recordedAt, entries}``; only node `node_id`'s when given.
    """
    get_run(run_id)
    events = (
        Event.select()
        .where((Event.run == run_id) & (Event.event_type == TRANSCRIPT_EVENT))
        .order_by(Event.revision)
    )
    found = []
    for event in events:
        payload = read_json(event.payload_hash)
        if node_id is not None and payload["nodeId"] != node_id:
            continue
        found.append((event, payload))
    attempts = {
        row.attempt_id: row
        for row in NodeAttempt.select().where(
            NodeAttempt.attempt_id.in_([payload["attemptId"] for _, payload in found])
        )
    }
    transcripts = []
    for event, payload in found:
        attempt = attempts.get(payload["attemptId"])
        transcripts.append(
            {
                "nodeId": payload["nodeId"],
                "attemptId": payload["attemptId"],
                "attemptNumber": attempt.attempt_number if attempt else None,
                "outcome": attempt.status if attempt else None,
                "recordedAt": event.recorded_at,
                "entries": read_json(payload["transcriptHash"]),
            }
        )
    return transcripts
