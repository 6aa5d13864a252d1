"""Checkpoints, continuations and resumes at the engine: which runs go on, and how far."""

from __future__ import annotations

from pathlib import Path

import pytest

from pi_workflows import checkpoint, compute, edge, idempotent_effect, workflow
from pi_workflows.engine import Engine
from pi_workflows.engine.local_backend import LocalRunBackend
from pi_workflows.errors import (
    ClaimLostError,
    InvalidInputError,
    NotFoundError,
    WorkflowSourceChangedError,
)
from pi_workflows.storage.models import Event, Run

from .conftest import bump, count, park_in_b, three_steps


def _continue(runs, definition, parent_id: str, answer, **options):
    child = runs.create(definition, answer, parent=parent_id, lineage="continuation", **options)
    command = {"kind": "continue", "input": answer, "parentRunId": parent_id}
    return child, runs.engine(definition, child).execute(command)


def _asked_then(then: dict, *, max_steps: int = 100):
    """ask (a checkpoint) → then (compute nodes after it, in order)."""
    names = list(then)
    return workflow(
        "ask",
        "ask",
        {"ask": checkpoint(summary="need an answer"), **then},
        [edge(a, b) for a, b in zip(["ask", *names], names, strict=False)],
        max_steps=max_steps,
    )


@pytest.mark.scenario("9.2")
def test_the_continuation_of_a_final_checkpoint_completes_at_once(runs) -> None:
    definition = workflow("only", "ask", {"ask": checkpoint(summary="ship it?")}, [])
    parent = runs.start(definition)
    assert (parent["status"], parent["waitingOn"]) == ("waiting", "ask")

    _, outcome = _continue(runs, definition, parent["runId"], "yes")

    assert outcome["status"] == "completed"
    assert outcome["finalOutput"] == "yes"


@pytest.mark.scenario("9.3")
def test_only_a_run_waiting_at_a_checkpoint_can_be_continued(runs) -> None:
    definition = _asked_then({"apply": compute(lambda ctx: ctx.outputs["ask"])})
    finished = runs.start(workflow("done", "a", {"a": compute(lambda ctx: 1)}, []))
    assert finished["status"] == "completed"

    with pytest.raises(InvalidInputError, match="is not waiting at a checkpoint"):
        _continue(runs, definition, finished["runId"], "yes")
    with pytest.raises(NotFoundError, match="run-missing does not exist"):
        _continue(runs, definition, "run-missing", "yes")


@pytest.mark.scenario("9.4")
def test_a_continuation_of_a_changed_workflow_is_refused(runs) -> None:
    definition = _asked_then({"apply": compute(lambda ctx: ctx.outputs["ask"])})
    changed = _asked_then({"apply": compute(lambda ctx: ctx.outputs["ask"], status_detail="new")})
    parent = runs.start(definition)
    # The continuation inherits the parent's definition; a worker loading the changed
    # source refuses to run it (there is no force, SPEC §7.1).
    child = runs.create(definition, "yes", parent=parent["runId"], lineage="continuation")
    command = {"kind": "continue", "input": "yes", "parentRunId": parent["runId"]}

    with pytest.raises(WorkflowSourceChangedError, match="definition digest differs"):
        runs.engine(changed, child).execute(command)

    assert Run.get_by_id(child).status == "queued"
    assert Event.select().where(Event.run == child, Event.event_type == "run.started").count() == 0


@pytest.mark.scenario("9.5")
def test_the_steps_a_continuation_carries_count_toward_max_steps(runs) -> None:
    definition = _asked_then({"apply": compute(lambda ctx: "applied")}, max_steps=1)
    parent = runs.start(definition)

    _, outcome = _continue(runs, definition, parent["runId"], "yes")

    assert outcome["status"] == "failed"
    assert outcome["error"] == "Workflow 'ask' exceeded max_steps (1) before node 'apply'"


class _DiesBeforeWaiting(LocalRunBackend):
    """A worker that dies after the checkpoint's step was saved, before `run.waiting`."""

    def write_snapshot(self, snapshot, trace_event):
        if trace_event["type"] == "run.waiting":
            raise ClaimLostError("the worker died")
        return super().write_snapshot(snapshot, trace_event)


@pytest.mark.scenario("9.10")
def test_a_crash_right_after_a_checkpoint_keeps_the_run_at_its_gate(runs, tmp_path: Path) -> None:
    after = tmp_path / "after.count"
    definition = workflow(
        "gate",
        "prepare",
        {
            "prepare": compute(lambda ctx: "prepared"),
            "ask": checkpoint(summary="go on?"),
            "after": compute(lambda ctx: bump(after)),
        },
        [edge("prepare", "ask"), edge("ask", "after")],
    )
    run_id = runs.create(definition)
    with pytest.raises(ClaimLostError):
        Engine(definition, _DiesBeforeWaiting(runs.store, run_id)).execute(
            {"kind": "start", "input": None}
        )
    assert [s["nodeId"] for s in runs.state(run_id)["steps"]] == ["prepare", "ask"]
    assert Run.get_by_id(run_id).status == "running"

    resumed = runs.engine(definition, run_id).execute({"kind": "resume"})

    assert (resumed["status"], resumed["waitingOn"]) == ("waiting", "ask")
    assert count(after) == 0


@pytest.mark.scenario("9.12")
def test_a_resumed_run_counts_its_replayed_steps_toward_max_steps(runs, tmp_path: Path) -> None:
    definition, _, _ = three_steps(tmp_path, idempotent_effect("b"), max_steps=2)
    run_id = park_in_b(runs, definition, tmp_path / "b.count")

    # a is replayed, b runs again: two steps, so c is one too many, as in a fresh run.
    resumed = runs.engine(definition, run_id).execute({"kind": "resume"})

    assert resumed["status"] == "failed"
    assert resumed["error"] == "Workflow 'steps' exceeded max_steps (2) before node 'c'"
    # A terminal run is not resumed again: it answers its outcome and writes nothing.
    revision = Run.get_by_id(run_id).revision
    assert runs.engine(definition, run_id).execute({"kind": "resume"}) == resumed
    assert Run.get_by_id(run_id).revision == revision


@pytest.mark.scenario("5.14")
def test_a_park_before_a_resume_reaches_a_node_holds(runs, tmp_path: Path) -> None:
    definition, _, b_file = three_steps(tmp_path, idempotent_effect("b"))
    run_id = park_in_b(runs, definition, b_file)

    resuming = runs.engine(definition, run_id)
    resuming.park()  # the host parks the run while its resume is being prepared
    outcome = resuming.execute({"kind": "resume"})

    assert outcome["status"] == "parked"
    assert count(b_file) == 1  # no node ran
    assert Run.get_by_id(run_id).status == "running"  # still resumable
    assert runs.engine(definition, run_id).execute({"kind": "resume"})["status"] == "completed"
    assert count(b_file) == 2
