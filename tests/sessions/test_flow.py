"""An interactive run with two agent steps, driven through the reference session client."""

from __future__ import annotations


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

    second = session.deliver_next()
    assert second["details"]["step"] == "draft"
    result = session.respond(second, {"draft": "do it"})
    assert result["submission"]["outcome"] == "accepted", result
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {
        "plan": {"draft": "do it"},
        "found": {"findings": ["README.md"]},
    }
