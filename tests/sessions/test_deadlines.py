"""Agent-step deadlines count model-turn time only, and expire during a model turn.

SPEC §9.4 (idle time moves a step's deadline), reference host-core §6.4 (a resumed step
gets its paused time back) and §6.9 (an expired step times out while its session's
coordinator has an active model turn).
"""

from __future__ import annotations

import time

import pytest

from tests.host.conftest import wait_until

SLOW = """
from pi_workflows import agent, workflow

WORKFLOW = workflow(
    name="slow", start_at="work", nodes={"work": agent("Work.", timeout_ms=60000)}, edges=[]
)
"""

# A deadline short enough to expire in a test; a timeout routes to the fallback.
ROUTED = """
from pi_workflows import agent, compute, switch, workflow

WORKFLOW = workflow(
    name="routed",
    start_at="work",
    nodes={
        "work": agent("Work fast.", timeout_ms=1500),
        "fallback": compute(lambda ctx: {"fallback": ctx.results["work"]["outcome"]}),
    },
    edges=[switch("work", on="$result.outcome", cases={"timed_out": "fallback"})],
)
"""
UNROUTED = """
from pi_workflows import agent, workflow

WORKFLOW = workflow(
    name="plain", start_at="work", nodes={"work": agent("Go.", timeout_ms=1000)}, edges=[]
)
"""
TOLERANCE_MS = 50


def _deadline(harness, run_id):
    rows = harness.query(
        "SELECT deadline_at, started_at, status, attempt_id FROM node_attempts "
        "WHERE run_id = ? AND node_id = 'work'",
        run_id,
    )
    return rows[0]


def _turns(harness, run_id):
    return harness.query(
        "SELECT started_at, ended_at FROM workflow_turns WHERE run_id = ? ORDER BY started_at",
        run_id,
    )


def _event_times(harness, run_id, event_type):
    rows = harness.query(
        "SELECT recorded_at FROM events WHERE run_id = ? AND event_type = ? ORDER BY event_seq",
        run_id,
        event_type,
    )
    return [row[0] for row in rows]


@pytest.mark.scenario("5.2", "7.2", "7.10")
def test_idle_and_paused_time_move_a_step_deadline(sessions, harness):
    harness.write_workflow("slow", SLOW)
    run_id = sessions.start("slow", "session-slow")
    session = sessions.open("session-slow")
    session.report_branch()
    message = session.deliver_next()
    # The step's message goes out in the commit that parks the run; its status follows.
    wait_until(lambda: _deadline(harness, run_id)[2] == "waiting", what="the run to wait")
    initial, started_at, status, _ = _deadline(harness, run_id)
    assert (initial, status) == (started_at + 60000, "waiting")

    # First turn: everything since the attempt started was idle.
    first = session.new_turn_id()
    assert session.report_turn(message, first, "started").receipt["ownership"] == "active"
    ((s1, _),) = _turns(harness, run_id)
    after_first = _deadline(harness, run_id)[0]
    assert after_first > initial and abs(after_first - (s1 + 60000)) <= TOLERANCE_MS

    # The same start again, later: adopted, and neither the turn's start nor the deadline move.
    wait_until(lambda: time.time() * 1000 > s1 + 100, what="time to pass since the start")
    repeat = session.report_turn(message, first, "started")
    assert (repeat.outcome, repeat.receipt["ownership"]) == ("adopted", "active")
    assert _turns(harness, run_id) == [(s1, None)]
    assert _deadline(harness, run_id)[:2] == (after_first, started_at)

    # Second turn: the gap since the first one ended is idle, the first turn's time counts.
    session.report_turn(message, first, "ended", stop_reason="error")
    reminder = session.deliver_next()
    wait_until(lambda: time.time() * 1000 > _turns(harness, run_id)[0][1] + 100, what="idle time")
    second = session.new_turn_id()
    assert session.report_turn(reminder, second, "started").receipt["ownership"] == "active"
    (_, e1), (s2, _) = _turns(harness, run_id)
    after_second = _deadline(harness, run_id)[0]
    assert abs(after_second - (after_first + (s2 - e1))) <= TOLERANCE_MS

    # Paused while the turn is open: resuming gives the paused time back.
    client = harness.client()
    assert client.pause_run(run_id)["paused"] is True
    paused_at = _event_times(harness, run_id, "run.paused")[-1]
    wait_until(lambda: time.time() * 1000 > paused_at + 100, what="paused time")
    assert client.resume_run(run_id)["waitingForInteraction"] is True
    client.close()
    resumed_at = _event_times(harness, run_id, "run.resumed")[-1]
    after_resume = _deadline(harness, run_id)[0]
    assert resumed_at - paused_at >= 100
    assert abs(after_resume - (after_second + (resumed_at - paused_at))) <= TOLERANCE_MS


def _working_on_step(sessions, harness, name, source, session_id):
    """Start `name` for `session_id` and begin a model turn on its first step."""
    harness.write_workflow(name, source)
    run_id = sessions.start(name, session_id)
    session = sessions.open(session_id)
    session.report_branch()
    message = session.deliver_next()
    turn = session.new_turn_id()
    assert session.report_turn(message, turn, "started").receipt["ownership"] == "active"
    return run_id, session, message, turn


@pytest.mark.scenario("7.11")
def test_an_expired_step_times_out_and_routes_through_its_result(sessions, harness):
    run_id, session, message, turn = _working_on_step(
        sessions, harness, "routed", ROUTED, "session-routed"
    )

    status = harness.wait_for_status(run_id, "completed", "failed", "timed_out")
    assert status["status"] == "completed", status
    assert status["finalOutput"] == {"fallback": "timed_out"}
    _, _, attempt_status, attempt_id = _deadline(harness, run_id)
    assert attempt_status == "timed_out"
    assert harness.query(
        "SELECT status FROM interactive_requests WHERE attempt_id = ?", attempt_id
    ) == [("cancelled",)]
    assert len(_event_times(harness, run_id, "run.interaction_timeout_started")) == 1
    # The session's late work is refused; its turn still ends cleanly.
    refused = session.send(
        "interaction.submit",
        {
            **{k: message["details"][k] for k in ("requestId", "attempt", "step")},
            "submissionId": "late",
            "value": {"done": True},
        },
        run_id=run_id,
        expected_revision=1,
    )
    assert refused.outcome == "conflict" and "stale" in refused.error
    ended = session.report_turn(message, turn, "ended", stop_reason="completed")
    assert ended.receipt["ownership"] == "settled"


@pytest.mark.scenario("5.3")
def test_a_turn_ended_while_paused_does_not_time_the_step_out(sessions, harness):
    run_id, session, message, turn = _working_on_step(
        sessions, harness, "plain", UNROUTED, "session-paused-end"
    )
    client = harness.client()
    try:
        assert client.pause_run(run_id)["paused"] is True
    finally:
        client.close()
    ended = session.report_turn(message, turn, "ended", stop_reason="aborted")
    assert (ended.outcome, ended.receipt["ownership"]) == ("accepted", "settled")

    deadline_at, _, _, attempt_id = _deadline(harness, run_id)
    client = harness.client()

    def settled_past_the_deadline():
        # Past the deadline and some poll ticks, and the paused worker gone (under load
        # it may still be stopping then): a step timed out would not be waiting.
        if time.time() * 1000 <= deadline_at + 1000:
            return None
        status = client.run_status(run_id)
        return status if status["status"] != "running" else None

    try:
        status = wait_until(settled_past_the_deadline, what="the paused run past the deadline")
    finally:
        client.close()
    assert (status["status"], status["paused"]) == ("waiting", True), status
    assert harness.query(
        "SELECT status FROM interactive_requests WHERE attempt_id = ?", attempt_id
    ) == [("pending",)]
    assert _deadline(harness, run_id)[2] == "waiting"


@pytest.mark.scenario("6.9", "7.11")
def test_no_expiry_without_an_active_coordinator_turn(sessions, harness):
    run_id, session, _, _ = _working_on_step(
        sessions, harness, "plain", UNROUTED, "session-plain-deadline"
    )

    # The coordinator goes away mid-turn, then a new one has not reported its branch:
    # the turn counts as inactive, so the passed deadline does not fire.
    session.close()
    replacement = sessions.open("session-plain-deadline")
    deadline_at = _deadline(harness, run_id)[0]
    wait_until(
        lambda: time.time() * 1000 > deadline_at + 1000, what="the deadline and some poll ticks"
    )
    assert harness.client().run_status(run_id)["status"] == "waiting"
    # Reporting a busy branch makes the model turn active again; what was left of the
    # step's time runs out, and then it expires.
    replacement.report_branch(is_idle=False)
    status = harness.wait_for_status(run_id, "timed_out", "failed", "completed")
    assert status["status"] == "timed_out", status
    assert "timed out after 1000 ms" in status["error"]
    assert _deadline(harness, run_id)[2] == "timed_out"


@pytest.mark.scenario("6.9", "6.10")
def test_a_step_clock_stops_while_its_session_has_no_coordinator(sessions, harness):
    """Reference 6.9 and 6.10: closing (or replacing) the coordinator stops the clock of a
    step whose turn is open; the next coordinator's branch report gives that time back."""
    run_id, session, _, _ = _working_on_step(sessions, harness, "slow", SLOW, "session-clock")
    before = _deadline(harness, run_id)[0]
    session.close()
    stopped_at = wait_until(
        lambda: _event_times(harness, run_id, "interaction.turn_interrupted"),
        what="the stopped clock",
    )[-1]
    wait_until(lambda: time.time() * 1000 > stopped_at + 300, what="time without a coordinator")
    assert _deadline(harness, run_id)[0] == before
    assert harness.client().run_status(run_id)["status"] == "waiting"

    replacement = sessions.open("session-clock")
    replacement.report_branch(is_idle=False)
    (resumed_at,) = _event_times(harness, run_id, "interaction.turn_resumed")
    after = _deadline(harness, run_id)[0]
    assert resumed_at - stopped_at >= 300
    assert abs((after - before) - (resumed_at - stopped_at)) <= TOLERANCE_MS

    # A second coordinator replacing a live one stops the clock the same way.
    intruder = sessions.open("session-clock")
    wait_until(
        lambda: len(_event_times(harness, run_id, "interaction.turn_interrupted")) == 2,
        what="the clock stopped by the replacement",
    )
    intruder.report_branch(is_idle=False)
    assert len(_event_times(harness, run_id, "interaction.turn_resumed")) == 2


@pytest.mark.integration
@pytest.mark.scenario("6.10")
def test_a_host_outage_during_an_open_turn_is_not_charged_to_the_step(sessions, harness):
    run_id, session, message, turn = _working_on_step(
        sessions, harness, "slow", SLOW, "session-outage"
    )
    before = _deadline(harness, run_id)[0]
    harness.host_process.kill()
    harness.host_process.wait()
    session.close()
    last_heartbeat = harness.query("SELECT heartbeat_at FROM host_state WHERE id = 1")[0][0]
    # The host stays down for a noticeable while (measured on the wall clock).
    down_until = time.time() * 1000 + 400
    wait_until(lambda: time.time() * 1000 > down_until, what="the outage")
    harness.start_host()
    ready_at = time.time() * 1000
    restarted_at = harness.query("SELECT started_at FROM host_state WHERE id = 1")[0][0]
    after = _deadline(harness, run_id)[0]
    assert restarted_at - last_heartbeat >= 400
    # Given back: the time from the last heartbeat to the new host's recovery, which runs
    # after the host's start and before it answers (a loaded machine stretches that window).
    given_back = after - before
    assert restarted_at - last_heartbeat - 50 <= given_back <= ready_at - last_heartbeat + 50
    assert harness.client().run_status(run_id)["status"] == "waiting"

    # The new host stopped the step's clock when it started; the next coordinator's report
    # starts it again and gives the time without a coordinator back (reference 6.10).
    (stopped_at,) = _event_times(harness, run_id, "interaction.turn_interrupted")
    assert abs(stopped_at - restarted_at) <= 1000
    wait_until(lambda: time.time() * 1000 > stopped_at + 200, what="time without a coordinator")
    sessions.open("session-outage").report_branch(is_idle=False)
    (resumed_at,) = _event_times(harness, run_id, "interaction.turn_resumed")
    assert abs(_deadline(harness, run_id)[0] - (after + (resumed_at - stopped_at))) <= TOLERANCE_MS
