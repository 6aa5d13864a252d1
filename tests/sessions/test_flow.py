"""An interactive run with two agent steps, driven through the reference session client."""

from __future__ import annotations

import json


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
    assert [result[k]["outcome"] for k in ("start", "submission", "end")] == ["accepted"] * 3
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {
        "plan": {"draft": "do it"},
        "found": {"findings": ["README.md"]},
    }
