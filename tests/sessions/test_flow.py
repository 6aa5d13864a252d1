"""An interactive run with two agent steps, driven through the reference session client."""

from __future__ import annotations

import json

import pytest


@pytest.mark.scenario("11.8", "6.1", "7.1", "7.3")
def test_two_agent_steps_complete_through_the_session_client(sessions, harness):
    run_id = sessions.start("two-steps", "session-a")
    session = sessions.open("session-a")
    session.report_branch()
    first = session.deliver_next()
    assert first["kind"] == "step" and first["details"]["step"] == "inspect"

    turn = session.new_turn_id()
    started = session.report_turn(first, turn, "started")
    assert (started.outcome, started.receipt["ownership"]) == ("accepted", "active")
    refused = session.submit(first, {"findings": "not a list"})
    assert refused.outcome == "rejected" and "findings must be a list" in refused.error
    accepted = session.submit(first, {"findings": ["README.md"]})
    assert accepted.outcome == "accepted", accepted
    ended = session.report_turn(
        first, turn, "ended", stop_reason="completed", response_entry_id="r1"
    )
    assert (ended.outcome, ended.receipt["ownership"]) == ("accepted", "settled")

    session.close()  # the second step goes through the CLI, a client of its own
    shown = json.loads(harness.cli("session", "next", "session-a", "--json").stdout)
    assert shown["details"]["step"] == "draft" and shown["kind"] == "step"
    answered = harness.cli("session", "respond", "session-a", "--output-json", '{"draft": "do it"}')
    result = json.loads(answered.stdout)
    assert result["workflowMessageId"] == shown["workflowMessageId"]
    assert [result[k]["outcome"] for k in ("start", "submission")] == ["accepted"] * 2
    # The run can end before the end of its last step's turn is reported: the host then
    # ended the open turn lost (SPEC 7.5) and adopts the late report as settled (9.4).
    assert result["end"]["outcome"] in ("accepted", "adopted")
    assert result["end"]["receipt"]["ownership"] == "settled"
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {
        "plan": {"draft": "do it"},
        "found": {"findings": ["README.md"]},
    }


NOTES = """
from pi_workflows import agent, edge, notify, workflow

WORKFLOW = workflow(
    name="notes",
    start_at="tell",
    nodes={"tell": notify("Started the review."), "ask": agent("Review it.")},
    edges=[edge("tell", "ask")],
)
"""


@pytest.mark.scenario("6.4", "6.5")
def test_a_notify_node_reaches_its_session_before_the_step(sessions, harness):
    harness.write_workflow("notes", NOTES)
    run_id = sessions.start("notes", "session-notes")
    session = sessions.open("session-notes", coordinator=False)
    view = session.wait_for(lambda v: len(v["workflowMessages"]) == 2)
    note, step = view["workflowMessages"]
    assert (note["kind"], note["content"], step["kind"]) == (
        "notification",
        "Started the review.",
        "step",
    )
    assert note["details"]["notificationId"].startswith(f"notification-{run_id}-")
    assert note["details"]["notificationId"].endswith("-1")
    assert view["nextWorkflowMessageId"] == note["workflowMessageId"]
