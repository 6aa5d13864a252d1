"""A Pi session as a workflow session: the real `pi` in RPC mode with the extension loaded."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from tests.pi.model_server import Hold, Text, ToolCall, ToolCalls
from tests.pi.session.workflow_pi import WorkflowPi, submit, two_turn_script
from tests.polling import wait_until


@pytest.mark.scenario("6.15", "7.13", "7.18")
def test_two_turn_runs_in_the_session_and_ends_with_one_explained_result(pi_session: WorkflowPi):
    pi_session.server.script(*two_turn_script())
    pi = pi_session.start()
    session_id = pi_session.session_id(pi)  # Pi's own session id: no override set
    pi.prompt("/workflow start two-turn")

    run = pi_session.wait_for_run("completed", "failed", "cancelled")
    assert run["status"] == "completed", run
    assert run["finalOutput"]["checklist"]["checklist"] == ["write CHANGELOG.md"]

    # The terminal message starts the turn whose reply explains the result.
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")
    wait_until(
        lambda: (
            pi_session.turns(session_id)
            and all(t[2] == "ended" for t in pi_session.turns(session_id))
            and len(pi_session.turns(session_id)) == 4
        ),
        what="four ended turns",
    )
    hosted = pi_session.host_messages(session_id)
    assert [m["kind"] for m in hosted] == ["step", "step", "step", "terminal"]
    assert all(m["status"] == "sent" for m in hosted)

    assert pi_session.shown_once(pi) == Counter(m["workflowMessageId"] for m in hosted)
    entries = pi_session.entries(pi)
    terminal = [e for e in entries if e["customType"] == "pi-workflows-presentation"]
    assert len(terminal) == 1 and terminal[0]["display"] is False
    steps = [e for e in entries if e["customType"] == "pi-workflows-step"]
    assert [e["details"]["step"] for e in steps] == ["inspect", "draft", "checklist"]
    # Each step message carries its node's status detail for the step card.
    assert [e["details"]["presentation"]["statusDetail"] for e in steps] == [
        "reading the project",
        "drafting a plan",
        "writing the checklist",
    ]

    last = pi_session.messages(pi)[-1]
    assert last["role"] == "assistant"
    assert (
        last["content"][0]["text"] == "The two-turn workflow completed: a plan to add a changelog."
    )
    assert pi_session.turns_ended_as(session_id, ["completed"] * 4)

    # The settled terminal turn is closed: an ordinary chat turn afterwards binds to nothing
    # (reference 7.13, 7.18).
    pi_session.server.script(Text("Anything else?"))
    pi.prompt("Thanks!")
    pi.wait_for(
        lambda e: e.get("type") == "agent_end" and "Anything else?" in json.dumps(e),
        what="the end of the chat turn",
    )
    assert len(pi_session.turns(session_id)) == 4
    assert len(pi_session.entries(pi)) == 4


def test_a_model_that_never_submits_gets_two_reminders_then_the_run_fails(pi_session: WorkflowPi):
    pi_session.server.script(
        Text("I looked around."),
        Text("I looked again."),
        Text("Still looking."),
        Text("The workflow failed: the step never got a result."),
    )
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id)
    pi.prompt("/workflow start two-turn")

    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert (run["status"], run["errorCode"]) == ("failed", "unproductiveTurns")
    assert run["error"] == "Workflow step ended three times without a valid submission"
    wait_until(lambda: pi_session.server.remaining() == 0, what="the explanation of the failure")
    hosted = pi_session.host_messages(session_id)
    assert [(m["kind"], m["details"].get("reason")) for m in hosted] == [
        ("step", "initial"),
        ("step", "reminder"),
        ("step", "reminder"),
        ("terminal", None),
    ]
    assert hosted[-1]["details"]["terminal"]["status"] == "failed"
    assert pi_session.shown_once(pi) == Counter(m["workflowMessageId"] for m in hosted)
    wait_until(
        lambda: pi_session.turns_ended_as(session_id, ["completed"] * 4),
        what="four completed turns",
    )


@pytest.mark.scenario("8.12")
def test_a_person_answers_a_decision_the_model_may_not(pi_session: WorkflowPi):
    attempt = ToolCall("workflow", {"action": "answer", "input": {"choice": "continue"}})
    pi_session.server.script(
        ToolCalls(attempt, text="Approving it."),
        Text("I may not answer that; please decide."),
        Text("The plan was approved and the workflow completed."),
    )
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id)
    pi.prompt('/workflow start human-decision {"goal": "ship 1.0"}')

    card = wait_until(
        lambda: next(
            (e for e in pi_session.entries(pi) if e["customType"] == "pi-workflows-interaction"),
            None,
        ),
        timeout=60,
        what="the decision card",
    )
    assert card["display"] is True and set(card["details"]["choices"]) == {
        "continue",
        "stop",
        "replan",
    }
    assert pi_session.server.requests == []  # a decision starts no model turn

    pi.prompt("Approve the plan for me.")
    pi.wait_for_type("agent_end")
    (refusal,) = pi_session.server.requests[1].tool_results()
    assert "Protected human decisions cannot be answered by the workflow tool" in refusal["content"]
    (decision,) = json.loads(pi_session.harness.cli("decision", "list", "--json").stdout)
    assert decision["status"] == "pending"

    # The reference's forms: a bare choice key; anything without a choice is refused.
    seen = len(pi_session.notices(pi))
    pi.prompt("/workflow answer 7")
    refused = wait_until(lambda: pi_session.notices(pi)[seen:], what="the refusal")[0]
    assert refused.startswith(
        "pi-workflows: A human decision answer requires a choice: answer with one of "
        "continue, replan, stop (e.g. /workflow answer continue)"
    ), refused
    pi.prompt("/workflow answer continue")
    run = pi_session.wait_for_run("completed", timeout=60)
    assert run["finalOutput"] == {"decision": {"choice": "continue"}}
    wait_until(lambda: pi_session.server.remaining() == 0, what="the explanation of the result")
    (answered,) = json.loads(pi_session.harness.cli("decision", "list", "--all", "--json").stdout)
    assert answered["status"] == "accepted"
    assert answered["resolution"]["channel"] == "session"
    assert [m["kind"] for m in pi_session.host_messages(session_id)] == ["decision", "terminal"]


@pytest.mark.scenario("6.15", "7.21")
def test_a_step_that_arrives_during_a_chat_turn_is_delivered_once_after_it(pi_session: WorkflowPi):
    """Reference 7.21 and 6.15: ordinary chat neither blocks delivery nor becomes a step turn."""
    pi_session.server.script(Hold(then=Text("Chatting.")), *two_turn_script())
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id)
    pi.prompt("Let us chat first.")
    pi_session.server.wait_for_requests(1)
    # Extension commands run while Pi streams: the run starts, its step must wait.
    pi.prompt("/workflow start two-turn")
    wait_until(
        lambda: pi_session.host_messages(session_id), timeout=60, what="the first step message"
    )
    assert pi_session.entries(pi) == [] and pi_session.turns(session_id) == []
    pi_session.server.release_holds()

    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")
    wait_until(
        lambda: pi_session.turns_ended_as(session_id, ["completed"] * 4),
        what="four completed turns",
    )
    hosted = pi_session.host_messages(session_id)
    assert pi_session.shown_once(pi) == Counter(m["workflowMessageId"] for m in hosted)
    # The chat turn came first and was nobody's: the first workflow turn is the step's own.
    first_step = hosted[0]["workflowMessageId"]
    assert pi_session.turns(session_id)[0][1] == first_step


def test_workflow_name_with_text_starts_it_with_that_task(pi_session: WorkflowPi):
    """Reference engine §1.1: `/workflow NAME text` starts NAME with `{task: "text"}`."""
    pi_session.server.script(
        submit("reply", {"reply": "Bonjour !"}),
        Text("Replied."),
        Text("The echo workflow said: Bonjour !"),
    )
    pi = pi_session.start(f"pi-session-{uuid.uuid4().hex}")
    pi.prompt("/workflow echo Say hello in French")
    run = pi_session.wait_for_run("completed", "failed", timeout=60)
    assert run["status"] == "completed", run
    assert run["finalOutput"] == {"reply": "Bonjour !"}
    assert "Task: Say hello in French" in pi_session.server.requests[0].last_user_text()


COUNTED = """
from pi_workflows import agent, workflow


def check(output, ctx):
    if not isinstance(output.get("count"), int):
        raise ValueError("count must be an integer, not " + repr(output.get("count")))


WORKFLOW = workflow(
    name="counted",
    start_at="count",
    nodes={"count": agent("Count the files.", expected_output='{"count": <int>}', validate=check)},
    edges=[],
)
"""


def test_a_rejected_submission_tells_the_model_what_was_wrong_in_a_sentence(
    pi_session: WorkflowPi,
):
    workflows = pi_session.pi_home.project / ".pi" / "workflows"  # Pi's working directory
    workflows.mkdir(parents=True)
    (workflows / "counted.workflow.py").write_text(COUNTED)
    pi_session.server.script(
        submit("count", {"count": "three"}),
        submit("count", {"count": 3}),
        Text("Counted."),
        Text("There are three files."),
    )
    pi = pi_session.start(f"pi-session-{uuid.uuid4().hex}")
    pi.prompt("/workflow counted")
    run = pi_session.wait_for_run("completed", "failed", timeout=60)
    assert run["status"] == "completed" and run["finalOutput"] == {"count": 3}, run
    (rejected,) = pi_session.server.requests[1].tool_results()
    assert rejected["content"] == (
        "The workflow rejected this output: count must be an integer, not 'three' "
        "Correct the output and submit again."
    )


def test_workflow_commands_list_show_and_cancel_the_sessions_run(pi_session: WorkflowPi):
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id)

    def notice_after(command: str) -> str:
        seen = len(pi_session.notices(pi))
        pi.prompt(command)
        wait_until(lambda: len(pi_session.notices(pi)) > seen, what=f"the answer to {command}")
        return pi_session.notices(pi)[seen]

    assert "two-turn" in notice_after("/workflow list").splitlines()
    assert notice_after("/workflow status") == (
        "pi-workflows: This Pi session has no workflow run; start one with /workflow start NAME."
    )
    # The step waits for a model that never answers: the person cancels the run.
    pi_session.server.script(Hold())
    started = notice_after("/workflow start two-turn")
    run_id = started.rsplit(" ", 1)[-1]
    pi_session.server.wait_for_requests(1, timeout=60)
    assert notice_after("/workflow status").startswith(f"two-turn {run_id}: ")
    assert notice_after("/workflow cancel") == "Workflow run: cancel requested."
    assert pi_session.wait_for_run("cancelled")["runId"] == run_id
    assert notice_after("/workflow").startswith("Usage: /workflow NAME [task text] | start")
    bogus = notice_after("/workflow bogus some task")
    assert bogus.startswith("pi-workflows: ") and "bogus" in bogus, bogus
