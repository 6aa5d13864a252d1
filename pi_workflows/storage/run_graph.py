"""A run's graph for viewers: the definition snapshot it was started with, and its steps.

The snapshot is kept as a blob whose address is the run's `definition_digest`: both are
the sha256 of the snapshot's canonical JSON, so runs of one definition share it, a
continuation or restart (which copies the digest) finds it, and retention keeps it while
any run names it. The steps are those of the run's last snapshot — every finished node
attempt with its prompt, output or error, those a continuation carried over from its
parent first — and the attempt running now.
"""

from __future__ import annotations

from typing import Any

from ..canonical import digest
from ..errors import InvalidInputError, NotFoundError
from .blobs import put_json, read_json
from .models import Blob, Run
from .runs import run_status

# What a viewer is given of each step (the rest of a step is the engine's bookkeeping).
STEP_FIELDS = (
    "attemptId",
    "nodeId",
    "nodeType",
    "outcome",
    "startedAt",
    "finishedAt",
    "durationMs",
    "prompt",
    "output",
    "error",
    "agent",
)


def store_definition(snapshot: Any, definition_digest: str) -> None:
    """Keep the definition snapshot a run is started with (inside its transaction).

    Refused, before anything is written, unless it is the snapshot `definition_digest`
    names: a client must not show viewers a graph other than the one the worker runs.
    """
    if not isinstance(snapshot, dict) or digest(snapshot) != definition_digest:
        raise InvalidInputError(
            "definitionSnapshot is not the definition definitionDigest names; resolve the "
            "workflow again (pi_workflows.client.start_request.start_payload) and resend."
        )
    stored = put_json(snapshot)
    # A snapshot shaped like a stored split value would be stored under another address.
    if stored != definition_digest:
        raise InvalidInputError("definitionSnapshot cannot be stored under its digest.")


def run_graph(run_id: str) -> dict[str, Any]:
    """`run.graph`: `{runId, definitionDigest, definition, steps, current, run}`;
    `definition` is None for a run started without its snapshot (by a client that did
    not send one), `current` is `{attemptId, nodeId, nodeType, startedAt}` of the attempt
    running now, or None, and `run` is the run's `run.status` object (one request gives a
    viewer all it draws)."""
    row = Run.select(Run.definition_digest, Run.state_hash).where(Run.run_id == run_id).first()
    if row is None:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    recorded = Blob.select(Blob.blob_hash).where(Blob.blob_hash == row.definition_digest).exists()
    state = read_json(row.state_hash) if row.state_hash is not None else {}
    current = None
    if state.get("currentAttemptId") is not None:
        current = {
            "attemptId": state["currentAttemptId"],
            "nodeId": state.get("currentNode"),
            "nodeType": state.get("currentNodeType"),
            "startedAt": state.get("currentNodeStartedAt"),
        }
    return {
        "runId": run_id,
        "definitionDigest": row.definition_digest,
        "definition": read_json(row.definition_digest) if recorded else None,
        "steps": [
            {key: step[key] for key in STEP_FIELDS if step.get(key) is not None}
            for step in state.get("steps", [])
        ],
        "current": current,
        "run": run_status(run_id),
    }
