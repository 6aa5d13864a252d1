"""A run's progress for the graph, from what a client is given: the progress entries of
`view.run.watch` (`run watch`; `storage.run_progress`) and the run's `run.status`.

A transition counts as taken when a node starts right after a node that finished and
the definition has that edge; a node started again without its attempt finishing (its
worker died) takes no transition. "As it was after step K" keeps the entries up to the
K-th finished attempt, so replay is this same fold over a prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..protocol.client_messages import ProgressKind
from .graph import NodeProgress, RunProgress, WorkflowGraph

FAILED_OUTCOMES = ("failed", "timed_out", "cancelled")
# What a pushed `nodeEnded` entry tells of a step.
PUSHED_STEP_FIELDS = (
    "attemptId",
    "nodeId",
    "outcome",
    "startedAt",
    "finishedAt",
    "durationMs",
    "error",
)


def watch_entries(payloads: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The progress entries of a sequence of `run_progress` event payloads, in order."""
    return [entry for payload in payloads for entry in payload["entries"]]


def step_entries(
    steps: Iterable[Mapping[str, Any]], current: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The progress entries of a `run.graph` answer: each finished step started and
    ended, then the attempt running now started (a continuation's steps include those
    its parent carried over, so its graph shows the whole way)."""
    entries: list[dict[str, Any]] = []
    for step in steps:
        ids = {"nodeId": step["nodeId"], "attemptId": step["attemptId"]}
        entries.append({"kind": ProgressKind.NODE_STARTED, "at": step["startedAt"], **ids})
        ended = {
            "kind": ProgressKind.NODE_ENDED,
            "at": step["finishedAt"],
            "outcome": step["outcome"],
            **ids,
        }
        if step.get("error"):
            ended["error"] = step["error"]
        entries.append(ended)
    if current is not None:
        entries.append(
            {
                "kind": ProgressKind.NODE_STARTED,
                "at": current["startedAt"],
                "nodeId": current["nodeId"],
                "attemptId": current["attemptId"],
            }
        )
    return entries


def with_entries(answer: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A `run.graph` answer moved on by progress entries a watch pushed after it: attempts
    it does not have yet become steps (without their values) or the running attempt, so
    a view draws a node's change the moment it is pushed; the next `run.graph` brings the
    values."""
    steps = list(answer["steps"])
    current = answer["current"]
    seen = {step["attemptId"] for step in steps}
    for entry in entries:
        attempt_id = entry.get("attemptId")
        if attempt_id is None or attempt_id in seen:
            continue
        if entry["kind"] == ProgressKind.NODE_STARTED:
            current = {
                "attemptId": attempt_id,
                "nodeId": entry["nodeId"],
                "nodeType": entry.get("nodeType"),
                "startedAt": entry["at"],
            }
        elif entry["kind"] == ProgressKind.NODE_ENDED:
            steps.append(
                {key: entry[key] for key in PUSHED_STEP_FIELDS if entry.get(key) is not None}
            )
            seen.add(attempt_id)
            if current is not None and current["attemptId"] == attempt_id:
                current = None
    return {**answer, "steps": steps, "current": current}


def entries_until_step(entries: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The entries up to and including the `step`-th finished node attempt (1-based)."""
    ended = 0
    for index, entry in enumerate(entries):
        if entry["kind"] == ProgressKind.NODE_ENDED:
            ended += 1
            if ended == step:
                return entries[: index + 1]
    return list(entries)


def run_progress(
    graph: WorkflowGraph,
    entries: Iterable[Mapping[str, Any]],
    status: Mapping[str, Any] | None = None,
    now_ms: int | None = None,
) -> RunProgress:
    """Fold progress entries into node states and taken transitions.

    With the run's `status` (a `run.status` object; the compact one a watch sends lacks
    the details) the last node is marked as the run stands: waiting at a checkpoint (with
    the status detail, or the summary the checkpoint put out), or failed with a run that
    stopped while it ran; with `now_ms` a running node gets its elapsed time.
    """
    edges = {(e.src, e.dst) for e in graph.edges}
    progress = RunProgress()
    started_at: dict[str, int] = {}
    finished: set[str] = set()  # attempt ids that ended
    previous: tuple[str, str | None] | None = None  # (node id, attempt id) last started
    for entry in entries:
        if entry["kind"] not in (ProgressKind.NODE_STARTED, ProgressKind.NODE_ENDED):
            continue
        node_id: str = entry["nodeId"]
        if entry["kind"] == ProgressKind.NODE_STARTED:
            state = progress.nodes.setdefault(node_id, NodeProgress())
            state.attempts += 1
            state.status, state.detail = "running", None
            started_at[node_id] = entry["at"]
            if previous is not None and previous[1] in finished:
                if (previous[0], node_id) in edges:
                    progress.taken.add((previous[0], node_id))
            previous = (node_id, entry["attemptId"])
        elif entry["kind"] == ProgressKind.NODE_ENDED:
            state = progress.nodes.setdefault(node_id, NodeProgress(attempts=1))
            finished.add(entry["attemptId"])
            if entry.get("outcome") in FAILED_OUTCOMES:
                state.status, state.detail = "failed", entry.get("error")
            else:
                state.status, state.detail = "done", None
    if status is not None and previous is not None:
        _apply_status(progress.nodes[previous[0]], status)
    for node_id, state in progress.nodes.items():
        if state.status == "running" and now_ms is not None:
            state.elapsed_ms = now_ms - started_at[node_id]
    return progress


def _apply_status(last: NodeProgress, status: Mapping[str, Any]) -> None:
    run_status = status.get("status")
    if run_status == "waiting":
        # A checkpoint's output is what it asks the human; its summary says it in a line.
        output = status.get("finalOutput")
        summary = output.get("summary") if isinstance(output, dict) else None
        last.status, last.detail = "waiting", status.get("statusDetail") or summary
    elif run_status == "running" and last.status == "running":
        last.detail = status.get("statusDetail")
    elif run_status in FAILED_OUTCOMES and last.status == "running":
        last.status = "failed"
