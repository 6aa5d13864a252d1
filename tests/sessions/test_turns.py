"""Turn-report adjudication (SPEC §9.4) against a real host and real session clients."""

from __future__ import annotations

import json
import threading

import pytest

from tests.host.workflows import relayed_worker_plugin

from .conftest import TWO_STEPS, Sessions

UNPRODUCTIVE = "Workflow step ended three times without a valid submission"


def _turn_rows(harness, run_id):
    return harness.query(
        "SELECT workflow_turn_id, state, stop_reason FROM workflow_turns WHERE run_id = ? "
        "ORDER BY started_at",
        run_id,
    )


def _report_branch(session, entries):
    """An idle branch report of exactly `entries`, sent raw so a refusal comes back."""
    return session.send(
        "workflowMessage.reportBranch",
        {
            "targetSessionId": session.session_id,
            "coordinatorEpoch": session.epoch,
            "entries": entries,
            "isIdle": True,
            "hasPendingMessages": False,
        },
    )


def _unproductive_turn(session, message, *, stop_reason="error"):
    turn = session.new_turn_id()
    started = session.report_turn(message, turn, "started")
    assert (started.outcome, started.receipt["ownership"]) == ("accepted", "active"), started
    return turn


def test_a_turn_the_model_failed_fails_the_run_with_what_the_session_says(sessions, harness):
    """Issue 24.5: an `error` end that says what failed ends the step at once (no
    reminders), with that reason; an `error` that is not one line of text is refused."""
    run_id = sessions.start("echo", "session-model-down")
    session = sessions.open("session-model-down")
    session.report_branch()
    message = session.deliver_next()
    turn = _unproductive_turn(session, message)
    bad = session.report_turn(message, turn, "ended", stop_reason="error", error="")
    assert bad.outcome == "rejected" and "Workflow turn error must be text" in bad.error
    failure = "The model local/qwen2.5-coder:7b failed: Connection error."
    ended = session.report_turn(message, turn, "ended", stop_reason="error", error=failure)
    assert (ended.outcome, ended.receipt["ownership"]) == ("accepted", "settled"), ended
    failed = harness.wait_for_status(run_id, "failed")
    assert (failed["errorCode"], failed["error"]) == ("modelFailed", failure)
    shown = json.loads(harness.cli("session", "messages", "session-model-down", "--json").stdout)
    assert [m["kind"] for m in shown] == ["step", "terminal"]  # no reminder


# The built-in worker behind a relay that passes the host's reply to an interaction
# request on only after HOLD_S: the step's message is out (it commits with the request)
# while the run's claim, which the worker's next write releases, is still held.
HOLDING_WORKER_PLUGIN = relayed_worker_plugin(
    r"""
import time

HOLD_S = 1.0
held = set()


def from_host(frame):
    if frame.get("messageId") in held:
        time.sleep(HOLD_S)
    return True


def from_worker(message):
    steps = message["payload"].get("steps") if message["operation"] == "store.batch" else None
    operations = [step["operation"] for step in steps] if steps else [message["operation"]]
    if "interaction.request" in operations:
        held.add(message["messageId"])
    return 1
"""
)


def test_a_turn_that_fails_before_the_worker_lets_its_run_go_still_fails_the_run(harness):
    """A model can fail within milliseconds of the step's message, before the worker
    that asked for the step has written the run's `waiting` and released its claim. The
    report waits for that worker instead of being refused ("could not fail")."""
    harness.add_plugin("holding_worker", HOLDING_WORKER_PLUGIN)
    harness.start_host()  # first_step writes the workflow
    sessions = Sessions(harness)
    try:
        run_id, session, message = sessions.first_step("two-steps", TWO_STEPS, "session-quick")
        turn = _unproductive_turn(session, message)
        [(owner,)] = harness.query("SELECT owner_id FROM leases WHERE run_id = ?", run_id)
        assert owner is not None  # the worker still holds the run
        failure = "The model local/qwen2.5-coder:7b failed: Connection error."
        ended = session.report_turn(message, turn, "ended", stop_reason="error", error=failure)
        assert ended.outcome == "accepted", ended.error
        assert ended.receipt["ownership"] == "settled"
        failed = harness.wait_for_status(run_id, "failed")
        assert (failed["errorCode"], failed["error"]) == ("modelFailed", failure)
    finally:
        sessions.close()


@pytest.mark.integration
@pytest.mark.scenario("7.4", "7.8", "A.5", "A.7")
def test_three_failed_turns_fail_the_run_and_release_ownership(sessions, harness):
    racing_run = sessions.start("echo", "session-race")
    plain_run = sessions.start("two-steps", "session-plain")
    race, plain = sessions.open("session-race"), sessions.open("session-plain")
    for session in (race, plain):
        session.report_branch()

    # session-plain: three provider errors in a row, reminders in between.
    for number in (1, 2, 3):
        message = plain.deliver_next()
        assert message["details"]["reason"] == ("initial" if number == 1 else "reminder")
        turn = _unproductive_turn(plain, message)
        ended = plain.report_turn(message, turn, "ended", stop_reason="error")
        assert (ended.outcome, ended.receipt["ownership"]) == ("accepted", "settled")
    failed = harness.wait_for_status(plain_run, "failed")
    assert failed["errorCode"] == "unproductiveTurns" and failed["error"] == UNPRODUCTIVE
    # Matching repeats adopt the saved end; a different one is refused, never a raw error.
    again = plain.report_turn(message, turn, "ended", stop_reason="error")
    assert (again.outcome, again.receipt["ownership"]) == ("adopted", "settled")
    other = plain.report_turn(message, turn, "ended", stop_reason="completed")
    assert other.outcome == "rejected" and "conflicts with its saved result" in other.error
    assert "UNIQUE" not in other.error

    # session-race: while the third turn is open, a valid submission lets a worker
    # validate it and write the run's terminal (completed) snapshot; the third end report
    # races that write. Whichever wins, the report is settled, never a raw error.
    for _ in range(2):
        message = race.deliver_next()
        turn = _unproductive_turn(race, message)
        race.report_turn(message, turn, "ended", stop_reason="error")
    message = race.deliver_next()
    turn = _unproductive_turn(race, message)
    submitter = sessions.open("session-race", coordinator=False)
    submitted: list = []
    worker_write = threading.Thread(
        target=lambda: submitted.append(submitter.submit(message, {"reply": "done"}))
    )
    worker_write.start()
    ended = race.report_turn(message, turn, "ended", stop_reason="error")
    worker_write.join()
    submitter.close()
    assert ended.outcome in ("accepted", "adopted") and ended.receipt["ownership"] == "settled"
    assert "UNIQUE" not in (ended.error or "") and "UNIQUE" not in (submitted[0].error or "")
    final = harness.wait_for_status(racing_run, "completed", "failed")
    if final["status"] == "completed":  # the worker won: its write ended the turn lost
        assert final["finalOutput"] == {"reply": "done"}
    else:  # the report won: the request was cancelled and the submission refused
        assert final["errorCode"] == "unproductiveTurns"
        assert submitted[0].outcome != "accepted"

    # The session reconnects idle: nothing is open, and an ordinary turn owns nothing.
    race.close()
    again = sessions.open("session-race")
    assert again.report_branch()["recorded"] is True
    assert again.view["openWorkflowMessageId"] is None
    rows = _turn_rows(harness, racing_run)
    assert [row[1] for row in rows] == ["ended"] * 3
    ordinary = again.report_turn(message, again.new_turn_id(), "started")
    assert (ordinary.outcome, ordinary.receipt) == (
        "adopted",
        {
            "schema": "pi-workflows.workflow-turn-report-receipt.v1",
            "ownership": "absent",
            "turn": None,
        },
    )
    assert _turn_rows(harness, racing_run) == rows


@pytest.mark.scenario("11.14", "5.2", "6.1", "6.8", "7.1", "7.5", "7.6", "7.7", "A.4")
def test_every_start_and_end_rule(sessions, harness):
    run_id = sessions.start("two-steps", "session-rules")
    session = sessions.open("session-rules")
    # A coordinator that has not reported its branch is not offered messages yet.
    pending = session.wait_for(lambda v: v["workflowMessages"])
    assert pending["nextWorkflowMessageId"] is None and pending["branchReportRequired"]
    message = pending["workflowMessages"][0]

    early = session.report_turn(message, "turn-early", "started")
    assert early.outcome == "rejected" and "branch must be reported" in early.error
    session.report_branch()
    unsent = session.report_turn(message, "turn-unsent", "started")
    assert (unsent.outcome, unsent.receipt["ownership"]) == ("adopted", "absent")
    unknown_end = session.report_turn(message, "turn-unknown", "ended", stop_reason="completed")
    assert (unknown_end.outcome, unknown_end.receipt["turn"]) == ("adopted", None)

    message = session.deliver_next()
    first = session.report_turn(message, "turn-1", "started")
    assert (first.outcome, first.receipt["ownership"]) == ("accepted", "active")
    repeat = session.report_turn(message, "turn-1", "started")
    assert (repeat.outcome, repeat.receipt["ownership"]) == ("adopted", "active")
    assert repeat.receipt["turn"] == first.receipt["turn"]
    second = session.report_turn(message, "turn-2", "started")
    assert second.outcome == "rejected" and "already has open turn turn-1" in second.error
    moved = session.report_turn({**message, "runId": "run-other"}, "turn-1", "started")
    assert moved.outcome == "rejected" and "identity conflict: turn-1" in moved.error

    # An aborted turn pauses the run; a paused step grants no turn; resume re-presents it.
    aborted = session.report_turn(message, "turn-1", "ended", stop_reason="aborted")
    assert (aborted.outcome, aborted.receipt["turn"]["stopReason"]) == ("accepted", "aborted")
    assert harness.client().run_status(run_id)["paused"] is True
    paused = session.report_turn(message, "turn-3", "started")
    assert (paused.outcome, paused.receipt["ownership"]) == ("adopted", "absent")
    resumed = harness.client().resume_run(run_id)
    assert resumed["waitingForInteraction"] is True
    message = session.deliver_next()
    assert message["details"]["reason"] == "resumed"

    # A turn the host settled as lost when the run ended absorbs the late real end.
    late = session.report_turn(message, "turn-late", "started")
    assert late.receipt["ownership"] == "active"
    harness.client().cancel_run(run_id)
    end = session.report_turn(message, "turn-late", "ended", stop_reason="error")
    assert (end.outcome, end.receipt["ownership"]) == ("adopted", "settled")
    assert end.receipt["turn"]["stopReason"] == "lost"
    restart = session.report_turn(message, "turn-late", "started")
    assert (restart.outcome, restart.receipt["ownership"]) == ("adopted", "settled")


@pytest.mark.scenario("6.7")
def test_a_replaced_coordinator_is_fenced(sessions):
    sessions.start("two-steps", "session-fence")
    old = sessions.open("session-fence")
    old.report_branch()
    new = sessions.open("session-fence")
    assert new.epoch != old.epoch
    old.wait_for(lambda v: v["coordinatorActive"] is False)
    refused = _report_branch(old, [])
    assert refused.outcome == "rejected" and "coordinator was replaced" in refused.error
    new.report_branch()
    message = new.deliver_next()
    stale = old.report_turn(message, old.new_turn_id(), "started")
    assert stale.outcome == "rejected" and "coordinator was replaced" in stale.error
    assert new.report_turn(message, new.new_turn_id(), "started").receipt["ownership"] == "active"


@pytest.mark.scenario("6.2", "6.3")
def test_branch_evidence_marks_sent_and_vanished_steps_come_back(sessions):
    sessions.start("two-steps", "session-branch")
    session = sessions.open("session-branch")
    session.report_branch()
    shown = session.deliver_next()
    entry = shown["sessionEntryId"]
    # Another session's coordinator cannot claim this session's message as shown.
    stranger = sessions.open("session-stranger")
    stranger.report_branch()
    foreign = _report_branch(
        stranger, [{"workflowMessageId": shown["workflowMessageId"], "sessionEntryId": "x"}]
    )
    assert foreign.outcome == "rejected" and "wrong origin session" in foreign.error
    conflicting = _report_branch(
        session, [{"workflowMessageId": shown["workflowMessageId"], "sessionEntryId": "x"}]
    )
    assert conflicting.outcome == "rejected" and "conflicting" in conflicting.error
    # The chat client lost its transcript: an idle report without the step re-presents it.
    _report_branch(session, [])
    view = session.wait_for(lambda v: v["nextWorkflowMessageId"])
    again = session.message(view["nextWorkflowMessageId"])
    assert (
        again["details"]["reason"] == "resumed"
        and again["details"]["requestId"] == (shown["details"]["requestId"])
    )
    assert session.message(shown["workflowMessageId"])["sessionEntryId"] == entry


@pytest.mark.integration
def test_a_step_reaches_only_its_session_once_across_restarts(sessions, harness):
    mine = sessions.start("two-steps", "session-mine")
    sessions.start("two-steps", "session-other")
    session = sessions.open("session-mine")
    session.report_branch()
    shown = session.deliver_next()
    other = sessions.open("session-other", coordinator=False)
    other.wait_for(lambda v: v["workflowMessages"])
    assert {m["runId"] for m in other.view["workflowMessages"]} != {mine}
    assert shown["workflowMessageId"] not in {
        m["workflowMessageId"] for m in other.view["workflowMessages"]
    }
    sessions.close()
    harness.stop()
    harness.start_host()
    for _ in range(2):  # a client restart, then another one
        session = sessions.open("session-mine")
        session.report_branch()
        view = session.wait_for(lambda v: v["coordinatorActive"])
        assert view["nextWorkflowMessageId"] is None
        steps = [m for m in view["workflowMessages"] if m["kind"] == "step"]
        assert [(m["workflowMessageId"], m["status"]) for m in steps] == [
            (shown["workflowMessageId"], "sent")
        ]
        assert view["openWorkflowMessageId"] == shown["workflowMessageId"]
        session.close()
    listed = json.loads(
        harness.cli("--no-autostart", "session", "messages", "session-mine", "--json").stdout
    )
    assert [m["workflowMessageId"] for m in listed if m["kind"] == "step"] == [
        shown["workflowMessageId"]
    ]
    assert set(listed[0]) == {
        "workflowMessageId",
        "runId",
        "kind",
        "status",
        "order",
        "content",
        "details",
    }
