"""The agent-executor contract: `accept` while the step runs, a bounded transcript kept."""

from __future__ import annotations

import json
from typing import Any

from pi_workflows import agent, workflow
from pi_workflows.engine import Engine
from pi_workflows.engine.agents import (
    TRANSCRIPT_HEAD_ENTRIES,
    TRANSCRIPT_MAX_BYTES,
    TRANSCRIPT_SAVE_EVERY_SECONDS,
    TRANSCRIPT_VALUE_CHARS,
    AgentTranscript,
)
from pi_workflows.engine.context import AbortSignal
from pi_workflows.engine.local_backend import LocalRunBackend
from pi_workflows.storage.transcripts import attempt_transcripts


def _check_count(output: Any, ctx: Any) -> Any:
    if not isinstance(output, dict) or not isinstance(output.get("count"), int):
        raise ValueError("count must be an integer")
    return {**output, "checked": True}


COUNTED = workflow(
    "counted",
    "count",
    {"count": agent("Count.", validate=_check_count)},
    [],
)


class CorrectingExecutor:
    """Submits a wrong output, then corrects it after reading the rejection."""

    def __init__(self) -> None:
        self.verdicts: list[dict[str, Any]] = []

    def run_agent_step(self, request: dict[str, Any], signal: AbortSignal) -> dict[str, Any]:
        transcript = request["transcript"]
        for output in ('{"count": "three"}', 'Here: {"count": 3}'):
            verdict = request["accept"](output)
            self.verdicts.append(verdict)
            transcript.add("tool_result", isError=not verdict["ok"], text=str(verdict))
        return {"output": "ignored: the accepted value is the step's output"}


class ChattyFailingExecutor:
    """Talks a lot, never submits, then fails."""

    def run_agent_step(self, request: dict[str, Any], signal: AbortSignal) -> dict[str, Any]:
        for index in range(500):
            request["transcript"].add("assistant", text=f"{index}:" + "x" * 5000)
        raise RuntimeError("the agent gave up")


def _run(runs, executor) -> dict[str, Any]:
    run_id = runs.create(COUNTED)
    engine = Engine(COUNTED, LocalRunBackend(runs.store, run_id), agent_executor=executor)
    return engine.execute({"kind": "start", "input": None})


def test_accept_refuses_then_accepts_and_the_accepted_value_is_the_output(runs) -> None:
    executor = CorrectingExecutor()
    outcome = _run(runs, executor)
    assert outcome["status"] == "completed", outcome
    assert outcome["finalOutput"] == {"count": 3, "checked": True}
    refused, accepted = executor.verdicts
    assert refused == {"ok": False, "error": "count must be an integer"}
    assert accepted == {"ok": True, "value": {"count": 3, "checked": True}}
    with runs.store.transaction():
        (transcript,) = attempt_transcripts(outcome["runId"])
    assert transcript["nodeId"] == "count" and transcript["outcome"] == "completed"
    assert [entry["isError"] for entry in transcript["entries"]] == [True, False]


def test_a_failed_attempt_keeps_a_bounded_transcript(runs) -> None:
    outcome = _run(runs, ChattyFailingExecutor())
    assert outcome["status"] == "failed"
    assert "the agent gave up" in outcome["error"]
    with runs.store.transaction():
        (transcript,) = attempt_transcripts(outcome["runId"], "count")
    entries = transcript["entries"]
    assert transcript["outcome"] == "failed"
    head, gap = entries[:TRANSCRIPT_HEAD_ENTRIES], entries[TRANSCRIPT_HEAD_ENTRIES]
    assert [entry["text"].split(":")[0] for entry in head] == [
        str(i) for i in range(TRANSCRIPT_HEAD_ENTRIES)
    ]
    assert gap["kind"] == "omitted" and gap["count"] > 0
    assert entries[-1]["text"].startswith("499:")
    assert len(entries) - 1 + gap["count"] == 500
    assert all(len(entry["text"]) < TRANSCRIPT_VALUE_CHARS + 40 for entry in head)
    assert head[0]["text"].endswith("[3002 more characters]")


def test_a_running_transcript_is_saved_in_chunks_of_new_entries_bounded_in_size() -> None:
    transcript = AgentTranscript()
    assert transcript.unsaved_chunk(0.0) is None  # nothing to save yet
    transcript.add("prompt", text="Count.")
    assert [e["kind"] for e in transcript.unsaved_chunk(0.0)] == ["prompt"]  # the first at once
    transcript.add("tool_call", name="bash")
    later = TRANSCRIPT_SAVE_EVERY_SECONDS
    assert transcript.unsaved_chunk(later - 0.1) is None  # not due yet
    assert [e["kind"] for e in transcript.unsaved_chunk(later)] == ["tool_call"]  # only the new
    assert transcript.unsaved_chunk(later * 5) is None  # nothing new
    # Past the size bound, no more chunks: an attempt's chunks stay as small as its transcript.
    saved = 0
    for index in range(600):
        transcript.add("assistant", text=f"{index}:" + "x" * 5000)
        chunk = transcript.unsaved_chunk(later * (index + 10))
        saved += len(json.dumps(chunk)) if chunk else 0
    assert TRANSCRIPT_MAX_BYTES <= saved < TRANSCRIPT_MAX_BYTES + 2 * TRANSCRIPT_VALUE_CHARS + 200
    assert transcript.unsaved_chunk(later * 10_000) is None
