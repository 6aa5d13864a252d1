"""Cancel, park and resume, crash recovery of effects, restart, and shell process groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from pi_workflows import (
    checkpoint,
    compute,
    edge,
    idempotent_effect,
    manual_effect,
    shell,
    workflow,
)
from pi_workflows.engine import Engine
from pi_workflows.engine.local_backend import LocalRunBackend
from pi_workflows.errors import ClaimLostError, WorkflowSourceChangedError
from pi_workflows.storage.models import Effect, Event, NodeAttempt, Run
from tests.polling import process_gone, wait_until

from .conftest import count, park_in_b, three_steps


def test_cancel_ends_the_active_attempt_and_the_run(runs, tmp_path: Path) -> None:
    definition, _, b_file = three_steps(tmp_path, idempotent_effect("b"))
    run_id = runs.create(definition)
    background = runs.in_thread(runs.engine(definition, run_id), {"kind": "start", "input": None})
    wait_until(lambda: count(b_file) == 1, what="node b to start")
    background.engine.cancel()
    outcome = background.join()
    assert outcome["status"] == "cancelled"
    state = runs.state(run_id)
    assert [s["outcome"] for s in state["steps"]] == ["ok", "cancelled"]
    last = Event.select().where(Event.run == run_id).order_by(Event.revision.desc()).first()
    assert last.event_type == "run.cancelled"
    # The action noticed the signal and returned: it did happen, so it is settled applied.
    assert Effect.get(Effect.run == run_id).status == "applied"


@pytest.mark.scenario("5.12", "9.6")
def test_park_then_resume_reruns_only_the_interrupted_node(runs, tmp_path: Path) -> None:
    definition, a_file, b_file = three_steps(tmp_path, idempotent_effect("b"))
    run_id = runs.create(definition)
    background = runs.in_thread(runs.engine(definition, run_id), {"kind": "start", "input": None})
    wait_until(lambda: count(b_file) == 1, what="node b to start")
    revision = Run.get_by_id(run_id).revision
    background.engine.park()
    outcome = background.join()
    assert outcome["status"] == "parked" and outcome["reason"] == "parked"
    assert Run.get_by_id(run_id).revision == revision  # parking writes nothing
    assert [s["nodeId"] for s in runs.state(run_id)["steps"]] == ["a"]

    resumed = runs.engine(definition, run_id).execute({"kind": "resume"})
    assert resumed["status"] == "completed"
    assert resumed["finalOutput"] == {"a": True, "b": 2}
    assert (count(a_file), count(b_file)) == (1, 2)
    statuses = [
        (a.node_id, a.status)
        for a in NodeAttempt.select()
        .where(NodeAttempt.run == run_id)
        .order_by(NodeAttempt.started_at)
    ]
    assert sorted(statuses) == [
        ("a", "completed"),
        ("b", "completed"),
        ("b", "interrupted"),
        ("c", "completed"),
    ]
    assert Effect.get(Effect.run == run_id).attempt_count == 2  # idempotent: ran again


def test_a_manual_effect_left_applying_parks_the_run_as_ambiguous(runs, tmp_path: Path) -> None:
    definition, _, b_file = three_steps(tmp_path, manual_effect("b"))
    run_id = park_in_b(runs, definition, b_file)

    resumed = runs.engine(definition, run_id).execute({"kind": "resume"})
    assert resumed["status"] == "parked" and resumed["reason"] == "effectAmbiguous"
    assert count(b_file) == 1  # never applied twice
    assert Effect.get(Effect.run == run_id).status == "ambiguous"


def test_resume_of_a_finished_run_writes_nothing(runs) -> None:
    definition = workflow("done", "a", {"a": compute(lambda ctx: 1)}, [])
    outcome = runs.start(definition)
    revision = Run.get_by_id(outcome["runId"]).revision
    again = runs.engine(definition, outcome["runId"]).execute({"kind": "resume"})
    assert again == outcome
    assert Run.get_by_id(outcome["runId"]).revision == revision


@pytest.mark.scenario("3.3")
def test_restart_starts_a_new_run_from_the_beginning(runs) -> None:
    definition = workflow("again", "a", {"a": compute(lambda ctx: ctx.input)}, [])
    first = runs.start(definition, {"x": 1})
    child = runs.create(definition, {"x": 1}, parent=first["runId"], lineage="restart")
    outcome = runs.engine(definition, child).execute({"kind": "restart", "input": {"x": 1}})
    assert outcome["finalOutput"] == {"x": 1}
    started = Event.get((Event.run == child) & (Event.event_type == "run.started"))
    from pi_workflows.storage import read_json

    assert read_json(started.payload_hash)["payload"]["restartOf"] == first["runId"]


@pytest.mark.scenario("9.9")
def test_a_changed_definition_refuses_to_run(runs) -> None:
    original = workflow("v", "a", {"a": compute(lambda ctx: 1)}, [])
    changed = workflow("v", "a", {"a": compute(lambda ctx: 1, status_detail="new")}, [])
    run_id = runs.create(original)
    with pytest.raises(WorkflowSourceChangedError, match="definition digest differs"):
        runs.engine(changed, run_id).execute({"kind": "start", "input": None})


class LosingStore(LocalRunBackend):
    """A store whose claim is lost at the n-th snapshot."""

    def __init__(self, *args, lose_at: int) -> None:
        super().__init__(*args)
        self.lose_at = lose_at
        self.snapshots = 0

    def write_snapshot(self, snapshot, trace_event):
        self.snapshots += 1
        if self.snapshots >= self.lose_at:
            raise ClaimLostError("claim lost")
        return super().write_snapshot(snapshot, trace_event)


@pytest.mark.scenario("2.20")
def test_claim_loss_stops_the_engine_without_further_writes(runs, store) -> None:
    definition = workflow(
        "lost", "a", {"a": compute(lambda ctx: 1), "b": compute(lambda ctx: 2)}, [edge("a", "b")]
    )
    run_id = runs.create(definition)
    losing = LosingStore(store, run_id, lose_at=3)
    with pytest.raises(ClaimLostError):
        Engine(definition, losing).execute({"kind": "start", "input": None})
    assert losing.snapshots == 3
    assert Run.get_by_id(run_id).status == "running"


@pytest.mark.parametrize("which", ["command", "node"])
def test_shell_timeout_kills_the_whole_process_group(runs, tmp_path: Path, which: str) -> None:
    pid_file = tmp_path / "child.pid"
    spec = {
        "command": "sh",
        "args": ["-c", f"sleep 60 & echo $! > {pid_file}; sleep 60"],
    }
    node_timeout = None
    if which == "command":
        spec["timeout_ms"] = 500
    else:
        node_timeout = 500
    definition = workflow(
        "hang",
        "run",
        {"run": shell(lambda ctx: spec, effect=idempotent_effect("hang"), timeout_ms=node_timeout)},
        [],
    )
    outcome = runs.start(definition)
    assert outcome["status"] == "timed_out"
    child = int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="pid"))
    wait_until(lambda: process_gone(child), timeout=5, what="the background child to die")


def test_shell_output_is_bounded(runs) -> None:
    spec = {
        "command": "sh",
        "args": ["-c", "yes | head -c 100000"],
        "max_output_chars": 1000,
    }
    definition = workflow(
        "big", "run", {"run": shell(lambda ctx: spec, effect=idempotent_effect("big"))}, []
    )
    stdout = runs.start(definition)["finalOutput"]["stdout"]
    assert stdout.endswith("[output truncated at 1000 characters]")
    assert len(stdout) < 1100


class _DiesAfterRunStarted(LocalRunBackend):
    """A backend whose worker dies right after the continuation's `run.started` commit."""

    def write_snapshot(self, snapshot, trace_event):
        revision = super().write_snapshot(snapshot, trace_event)
        if trace_event["type"] == "run.started":
            raise ClaimLostError("the worker died")
        return revision


@pytest.mark.scenario("9.11")
def test_a_continuation_interrupted_before_its_next_node_resumes_past_the_checkpoint(
    runs,
) -> None:
    definition = workflow(
        "ask",
        "ask",
        {
            "ask": checkpoint(summary="need an answer"),
            "apply": compute(lambda ctx: {"answer": ctx.outputs["ask"]}),
        },
        [edge("ask", "apply")],
    )
    parent = runs.start(definition)
    child = runs.create(definition, {"ship": True}, parent=parent["runId"], lineage="continuation")
    command = {"kind": "continue", "input": {"ship": True}, "parentRunId": parent["runId"]}
    with pytest.raises(ClaimLostError):
        Engine(definition, _DiesAfterRunStarted(runs.store, child)).execute(command)

    resumed = runs.engine(definition, child).execute({"kind": "resume"})
    assert resumed["status"] == "completed"  # not waiting again at the answered checkpoint
    assert resumed["finalOutput"] == {"answer": {"ship": True}}
