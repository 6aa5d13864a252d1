"""Each node kind, executed against a real SQLite store in process."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from pi_workflows import (
    action,
    agent,
    checkpoint,
    compute,
    edge,
    idempotent_effect,
    notify,
    route,
    switch,
    workflow,
)
from pi_workflows.builtin.workflows import EXAMPLES_DIR
from pi_workflows.discovery import load_workflow_file
from pi_workflows.errors import InvalidInputError
from pi_workflows.storage import decision_resolutions, read_json, read_text
from pi_workflows.storage.models import (
    Effect,
    Event,
    HumanDecision,
    InteractiveRequest,
    InteractiveSubmission,
    NodeAttempt,
    Run,
    WorkflowMessage,
    WorkflowUpdate,
)


def example(name: str):
    return load_workflow_file(EXAMPLES_DIR / f"{name}.workflow.py")[0]


def test_hello_greets_by_name_or_world(runs) -> None:
    hello = example("hello")
    assert runs.start(hello, {"name": "Ada"})["finalOutput"] == {"greeting": "Hello, Ada!"}
    outcome = runs.start(hello)
    assert outcome == {
        "runId": outcome["runId"],
        "status": "completed",
        "finalOutput": {"greeting": "Hello, world!"},
    }
    events = [e.event_type for e in Event.select().where(Event.run == outcome["runId"])]
    assert events == [
        "run.created",
        "run.started",
        "node.started",
        "node.finished",
        "run.completed",
    ]
    state = runs.state(outcome["runId"])
    assert state["schema"] == "pi-workflows.run-state.v1"
    assert state["traceSeq"] == 4 and "currentNode" not in state
    attempt = NodeAttempt.get(NodeAttempt.run == outcome["runId"])
    assert (attempt.node_id, attempt.status) == ("greet", "completed")
    assert Run.get_by_id(outcome["runId"]).status == "completed"


def test_shell_example_runs_a_managed_effect(runs) -> None:
    outcome = runs.start(example("shell"), {"text": "hi there"})
    assert outcome["finalOutput"] == {"echoed": "hi there"}
    step = runs.state(outcome["runId"])["steps"][0]
    assert step["action"]["actionType"] == "shell" and step["action"]["exitCode"] == 0
    effect = Effect.get(Effect.run == outcome["runId"])
    assert (effect.effect_type, effect.policy, effect.status) == ("echo", "idempotent", "applied")


def test_non_zero_exit_fails_unless_allowed(runs) -> None:
    def build(allow: bool):
        from pi_workflows import shell

        spec = {"command": "sh", "args": ["-c", "echo oops >&2; exit 3"]}
        if allow:
            spec["allowNonZeroExit"] = True
        return workflow(
            "exit",
            "run",
            {"run": shell(lambda ctx: spec, effect=idempotent_effect("exit"))},
            [],
        )

    failed = runs.start(build(False))
    assert failed["status"] == "failed"
    assert failed["error"] == "Node 'run' failed: Shell command 'sh' exited with 3: oops"
    allowed = runs.start(build(True))
    assert allowed["status"] == "completed" and allowed["finalOutput"]["exitCode"] == 3


def test_action_publishes_updates_within_limits(runs) -> None:
    def work(ctx):
        ctx.publish_update("progress", "overall", {"status": "running"})
        ctx.publish_update("progress", "overall", {"status": "completed"})
        return {"done": True}

    outcome = runs.start(
        workflow("act", "work", {"work": action(work, effect=idempotent_effect("w"))}, [])
    )
    assert outcome["finalOutput"] == {"done": True}
    rows = list(WorkflowUpdate.select().where(WorkflowUpdate.run == outcome["runId"]))
    assert len(rows) == 1 and read_json(rows[0].data_hash) == {"status": "completed"}

    def bad(ctx):
        ctx.publish_update("Bad Type", "k", {})

    failed = runs.start(
        workflow("act", "work", {"work": action(bad, effect=idempotent_effect("w"))}, [])
    )
    assert failed["status"] == "failed" and "Update type 'Bad Type'" in failed["error"]


def test_compute_cannot_publish_updates_or_return_non_json(runs) -> None:
    publishing = runs.start(
        workflow("c", "a", {"a": compute(lambda ctx: ctx.publish_update("t", "k", {}))}, [])
    )
    assert "only action nodes" in publishing["error"]
    non_json = runs.start(workflow("c", "a", {"a": compute(lambda ctx: {1, 2})}, []))
    assert non_json["status"] == "failed" and "is not a JSON value" in non_json["error"]


def test_notify_indexes_count_earlier_ok_attempts(runs) -> None:
    definition = workflow(
        "notes",
        "tell",
        {
            "tell": notify(lambda ctx: "  step done  "),
            "check": compute(
                lambda ctx: {
                    "again": sum(1 for s in ctx.state["steps"] if s["nodeId"] == "tell") < 2
                }
            ),
            "end": compute(lambda ctx: ctx.outputs["tell"]),
        },
        [
            edge("tell", "check"),
            switch("check", on="$.again", cases={"true": "tell", "false": "end"}),
        ],
    )
    outcome = runs.start(definition, session="session-1", mode="interactive")
    assert outcome["status"] == "completed"
    messages = list(
        WorkflowMessage.select()
        .where(WorkflowMessage.run == outcome["runId"])
        .order_by(WorkflowMessage.order_number)
    )
    contents = [read_json(m.content_hash) for m in messages]
    assert [c["details"]["notificationIndex"] for c in contents] == [1, 2]
    assert {c["text"] for c in contents} == {"step done"}
    assert outcome["finalOutput"] == {
        "notificationId": messages[1].source_id,
        "targetSessionId": "session-1",
    }


def test_notify_without_an_origin_session_fails(runs) -> None:
    outcome = runs.start(workflow("n", "tell", {"tell": notify("hello")}, []))
    assert outcome["status"] == "failed" and "has no origin session" in outcome["error"]


@pytest.mark.scenario("9.1")
def test_checkpoint_waits_and_a_continuation_routes_on_the_answer(runs) -> None:
    definition = workflow(
        "ask",
        "prepare",
        {
            "prepare": compute(lambda ctx: {"question": "ship it?"}),
            "ask": checkpoint(summary="need an answer"),
            "apply": compute(
                lambda ctx: {"answer": ctx.outputs["ask"], "was": ctx.outputs["prepare"]}
            ),
        },
        [edge("prepare", "ask"), edge("ask", "apply")],
    )
    parent = runs.start(definition)
    assert parent["status"] == "waiting" and parent["waitingOn"] == "ask"
    assert parent["finalOutput"] == {"summary": "need an answer"}
    child = runs.create(definition, {"ship": True}, parent=parent["runId"], lineage="continuation")
    outcome = runs.engine(definition, child).execute(
        {"kind": "continue", "input": {"ship": True}, "parentRunId": parent["runId"]}
    )
    assert outcome["status"] == "completed"
    assert outcome["finalOutput"] == {"answer": {"ship": True}, "was": {"question": "ship it?"}}
    state = runs.state(child)
    assert state["carriedStepCount"] == 2 and len(state["steps"]) == 3


@pytest.mark.scenario("10.14")
def test_human_decision_request_and_continuation(runs) -> None:
    definition = example("human-decision")
    parent = runs.start(definition, {"goal": "release"}, session="s", mode="interactive")
    assert parent["status"] == "waiting" and parent["waitingOn"] == "approve"
    request = parent["finalOutput"]
    assert request["schema"] == "pi-workflows.human-decision-request.v1"
    assert "subject" not in request and request["deadlineAt"] is not None
    row = HumanDecision.get_by_id(request["decisionId"])
    assert (row.audience, row.status, row.node_id) == ("operator", "pending", "approve")
    assert read_json(row.request_hash)["subject"]["goal"] == "release"

    answer = {"choice": "replan", "input": {"instructions": "smaller"}}
    child = runs.create(
        definition, {"goal": "release"}, parent=parent["runId"], lineage="continuation"
    )

    def continue_with(response: dict) -> dict:
        return runs.engine(definition, child).execute(
            {
                "kind": "continue",
                "input": {"goal": "release"},
                "parentRunId": parent["runId"],
                "humanDecision": {"decisionId": request["decisionId"], "response": response},
            }
        )

    # Only the recorded winner of the decision may continue its run.
    with pytest.raises(InvalidInputError, match="has no recorded answer"):
        continue_with(answer)
    with runs.store.transaction():
        decision_resolutions.resolve(row, provenance="human", response=answer, channel="cli")
    with pytest.raises(InvalidInputError, match="is not the recorded answer"):
        continue_with({"choice": "continue"})
    outcome = continue_with(answer)
    assert outcome["finalOutput"] == {"decision": answer}
    assert runs.state(child)["humanDecision"] == {
        "decisionId": request["decisionId"],
        "choice": "replan",
    }


@pytest.fixture
def agent_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def use(reply: str) -> None:
        script = tmp_path / "agent.py"
        script.write_text(
            "import sys\nprompt = sys.stdin.read()\n"
            "assert 'Workflow step contract' in prompt\n"
            f"print({reply!r})\n"
        )
        monkeypatch.setenv(
            "PI_WORKFLOWS_AGENT_COMMAND",
            f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}",
        )

    return use


def test_headless_agent_uses_the_command_executor(runs, agent_command) -> None:
    agent_command('Sure! Here it is: {"reply": "hi"} hope that helps')
    outcome = runs.start(example("echo"), {"task": "say hi"})
    assert outcome["status"] == "completed" and outcome["finalOutput"] == {"reply": "hi"}
    step = runs.state(outcome["runId"])["steps"][0]
    assert step["prompt"].startswith("Task: say hi")
    run = Run.get_by_id(outcome["runId"])
    assert (
        read_text(run.presentation_prompt_hash) == "Relay the reply to the user in your own words."
    )


def test_decision_output_must_pick_a_choice(runs, agent_command) -> None:
    definition = workflow(
        "pick",
        "choose",
        {
            "choose": route("Which way?", choices=["left", "right"]),
            "left": compute(lambda ctx: "went left"),
            "right": compute(lambda ctx: "went right"),
        },
        [switch("choose", on="$.route", cases={"left": "left", "right": "right"})],
    )
    agent_command('```json\n{"route": "right", "reason": "because"}\n```')
    assert runs.start(definition)["finalOutput"] == "went right"
    agent_command('{"route": "up"}')
    refused = runs.start(definition)
    assert refused["status"] == "failed" and '"route" is one of' in refused["error"]


def test_interactive_agent_waits_for_its_session_then_resumes(runs, store) -> None:
    definition = workflow(
        "ask-agent",
        "think",
        {
            "think": agent("Think hard.", validate=lambda output, ctx: {**output, "checked": True}),
            "done": compute(lambda ctx: ctx.outputs["think"]),
        },
        [edge("think", "done")],
    )
    run_id = runs.create(definition, mode="interactive", session="s-1")
    waiting = runs.engine(definition, run_id).execute({"kind": "start", "input": None})
    assert waiting["status"] == "waiting" and waiting["waitingOn"] == "think"
    request = InteractiveRequest.get(InteractiveRequest.run == run_id)
    assert (request.node_id, request.target_session_id) == ("think", "s-1")
    assert NodeAttempt.get(NodeAttempt.run == run_id).status == "waiting"
    # Nothing accepted yet: resuming keeps waiting and writes nothing.
    revision = Run.get_by_id(run_id).revision
    assert runs.engine(definition, run_id).execute({"kind": "resume"})["status"] == "waiting"
    assert Run.get_by_id(run_id).revision == revision

    from pi_workflows.storage import put_json

    with store.transaction():
        InteractiveSubmission.create(
            submission_id="sub-1",
            request=request.request_id,
            idempotency_key="k",
            request_revision=1,
            payload_hash=put_json('{"idea": 42}'),
            outcome="accepted",
            submitted_at=1,
        )
        InteractiveRequest.update(accepted_submission_id="sub-1", status="settled").execute()
    outcome = runs.engine(definition, run_id).execute({"kind": "resume"})
    assert outcome["status"] == "completed"
    assert outcome["finalOutput"] == {"idea": 42, "checked": True}
    assert runs.state(run_id)["steps"][0]["attemptId"] == request.attempt_id
