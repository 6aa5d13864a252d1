"""Turn hooks through a real host and real session clients (SPEC §3, §9.4)."""

from __future__ import annotations

import pytest

from tests.host.conftest import HostHarness

from .conftest import TWO_STEPS, Sessions

LIMIT_ONE = """
from pi_workflows import hookimpl


@hookimpl
def piw_unproductive_turn_limit(run, node_id):
    return 1
"""

DENY_ONE_SESSION = """
from pi_workflows import hookimpl
from pi_workflows.plugin import TurnReceipt


@hookimpl
def piw_adjudicate_turn_report(report, ctx):
    if report.target_session_id == "session-denied" and report.state == "started":
        return TurnReceipt("adopted", "absent", None)
    return None
"""


def _sessions(harness: HostHarness, **plugins: str) -> Sessions:
    for name, source in plugins.items():
        harness.add_plugin(name, source)
    harness.write_workflow("two-steps", TWO_STEPS)
    harness.start_host()
    return Sessions(harness)


def _started_step_turn(sessions: Sessions, session_id: str) -> tuple:
    """Start `two-steps` for a session and open a model turn on its first step."""
    run_id = sessions.start("two-steps", session_id)
    session = sessions.open(session_id)
    session.report_branch()
    message = session.deliver_next()
    turn = session.new_turn_id()
    session.report_turn(message, turn, "started")
    return run_id, session, message, turn


@pytest.mark.hook_effect("piw_unproductive_turn_limit")
@pytest.mark.scenario("A.5")
def test_the_unproductive_turn_limit_comes_from_the_plugin(harness: HostHarness):
    sessions = _sessions(harness, limit_one=LIMIT_ONE)
    try:
        run_id, session, message, turn = _started_step_turn(sessions, "session-one")
        ended = session.report_turn(message, turn, "ended", stop_reason="error")
        assert ended.outcome == "accepted"
        failed = harness.wait_for_status(run_id, "failed")
        assert failed["errorCode"] == "unproductiveTurns"
        assert failed["error"] == "Workflow step ended once without a valid submission"
    finally:
        sessions.close()


@pytest.mark.hook_effect("piw_adjudicate_turn_report")
def test_an_adjudication_plugin_decides_who_owns_a_turn(harness: HostHarness):
    sessions = _sessions(harness, deny_one_session=DENY_ONE_SESSION)
    try:
        for session_id in ("session-denied", "session-allowed"):
            sessions.start("two-steps", session_id)
        denied, allowed = sessions.open("session-denied"), sessions.open("session-allowed")
        outcomes = {}
        for name, session in (("denied", denied), ("allowed", allowed)):
            session.report_branch()
            started = session.report_turn(session.deliver_next(), session.new_turn_id(), "started")
            outcomes[name] = (started.outcome, started.receipt["ownership"])
        assert outcomes == {"denied": ("adopted", "absent"), "allowed": ("accepted", "active")}
    finally:
        sessions.close()


LOST_WITHOUT_CONSEQUENCE = """
from pi_workflows import hookimpl
from pi_workflows.plugin import TurnReceipt


@hookimpl
def piw_adjudicate_turn_report(report, ctx):
    if report.state == "ended" and report.stop_reason == "lost":
        existing = ctx.get_turn(report.workflow_turn_id)
        if existing is not None and existing["state"] == "started":
            return TurnReceipt("accepted", "settled", ctx.end_turn(report))
    return None
"""


def test_lost_ends_of_an_idle_branch_go_through_adjudication(harness: HostHarness):
    sessions = _sessions(harness, lost_without_consequence=LOST_WITHOUT_CONSEQUENCE)
    try:
        run_id, session, _, _ = _started_step_turn(sessions, "session-idle")
        session.report_branch(is_idle=True, has_pending=False)  # the turn is gone
        turns = harness.query(
            "SELECT state, stop_reason FROM workflow_turns WHERE run_id = ?", run_id
        )
        assert turns == [("ended", "lost")]
        # The plugin's policy, not the core's: no unproductive end counted, no reminder.
        assert harness.query(
            "SELECT unproductive_turn_ends FROM interactive_requests WHERE run_id = ?", run_id
        ) == [(0,)]
        reasons = harness.query(
            "SELECT idempotency_key FROM workflow_messages WHERE run_id = ? AND kind = 'step'",
            run_id,
        )
        assert not any(key.endswith(":reminder") for (key,) in reasons)
    finally:
        sessions.close()
