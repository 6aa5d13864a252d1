"""Lost and late acknowledgements between the extension and the host (reference 6.16, 7.12,
7.14, 7.15, 7.17, 7.19, 7.20, 8.12): nothing is shown twice, no turn is reported twice or lost."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections import Counter

import pytest

from tests.pi.model_server import Hold, Text
from tests.pi.session.relay import Relay
from tests.pi.session.workflow_pi import WorkflowPi, submit, two_turn_script
from tests.polling import process_gone, wait_until


def _turn_reports(relay: Relay, **where: str) -> list[dict]:
    return [
        r["payload"]
        for r in relay.requests_for("workflowTurn.report")
        if all(r["payload"].get(key) == value for key, value in where.items())
    ]


def _finish_two_turn(pi_session: WorkflowPi, pi, session_id: str) -> list[dict]:
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")
    wait_until(
        lambda: pi_session.turns_ended_as(session_id, ["completed"] * 4),
        what="four completed turns",
    )
    hosted = pi_session.host_messages(session_id)
    assert all(m["status"] == "sent" for m in hosted)
    assert pi_session.shown_once(pi) == Counter(m["workflowMessageId"] for m in hosted)
    return hosted


@pytest.mark.scenario("6.16", "7.12", "7.15", "8.4", "8.12")
def test_lost_branch_acknowledgements_resend_nothing_and_keep_the_turn_order(
    pi_session: WorkflowPi, relay: Relay
):
    def branch_of(count: int):
        return lambda r: (
            r["operation"] == "workflowMessage.reportBranch"
            and len(r["payload"]["entries"]) == count
        )

    relay.lose_reply(branch_of(1))  # the report that first shows the inspect step
    relay.lose_reply(branch_of(4))  # the report that first shows the terminal message
    pi_session.server.script(*two_turn_script())
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id, PI_WORKFLOWS_CLI=relay.cli)
    pi.prompt("/workflow start two-turn")
    hosted = _finish_two_turn(pi_session, pi, session_id)

    # Both losses cut the connection: three coordinator epochs reported the branch.
    epochs = {
        r["payload"]["coordinatorEpoch"] for r in relay.requests_for("workflowMessage.reportBranch")
    }
    assert len(epochs) == 3
    # The step's start, its one submission and its end, in that order (6.16, 7.12).
    inspect = hosted[0]["workflowMessageId"]
    order = [
        (r["operation"], r["payload"].get("state"))
        for r in relay.requests
        if r["payload"].get("workflowMessageId") == inspect
        or (r["operation"] == "interaction.submit" and r["payload"]["step"] == "inspect")
    ]
    assert order == [
        ("workflowTurn.report", "started"),
        ("interaction.submit", None),
        ("workflowTurn.report", "ended"),
    ]
    # The terminal message was finalized once: shown once, one start and one end (8.12).
    terminal = hosted[3]["workflowMessageId"]
    assert [p["state"] for p in _turn_reports(relay, workflowMessageId=terminal)] == [
        "started",
        "ended",
    ]
    # A sent message waits for its own turn (7.15): each message's one start report comes
    # after a branch report that holds it, never before.
    for message in hosted:
        (start,) = _turn_reports(
            relay, workflowMessageId=message["workflowMessageId"], state="started"
        )
        at = relay.requests.index(next(r for r in relay.requests if r["payload"] is start))
        assert any(
            message["workflowMessageId"]
            in {e["workflowMessageId"] for e in r["payload"]["entries"]}
            for r in relay.requests[:at]
            if r["operation"] == "workflowMessage.reportBranch"
        ), message["kind"]


@pytest.mark.scenario("7.19", "7.20")
def test_a_lost_end_acknowledgement_is_repeated_and_a_late_start_keeps_its_reply(
    pi_session: WorkflowPi, relay: Relay
):
    relay.lose_reply(
        lambda r: r["operation"] == "workflowTurn.report" and r["payload"]["state"] == "ended"
    )
    starts: list[str] = []

    def fourth_start(request: dict) -> bool:
        if (
            request["operation"] == "workflowTurn.report"
            and request["payload"]["state"] == "started"
        ):
            starts.append(request["payload"]["workflowTurnId"])
        return len(starts) == 4

    late = relay.hold_reply(fourth_start)  # the terminal message's start
    pi_session.server.script(*two_turn_script())
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id, PI_WORKFLOWS_CLI=relay.cli)
    pi.prompt("/workflow start two-turn")
    # The model answers the terminal message while its start is still unacknowledged.
    pi.wait_for(
        lambda e: (
            e.get("type") == "agent_end" and "The two-turn workflow completed" in json.dumps(e)
        ),
        timeout=90,
        what="the explanation turn's end",
    )
    late.set()
    _finish_two_turn(pi_session, pi, session_id)

    # 7.19: the lost end was sent again, identical but for the new coordinator epoch.
    first_end = next(p for p in _turn_reports(relay, state="ended"))
    again = _turn_reports(relay, state="ended", workflowTurnId=first_end["workflowTurnId"])
    assert len(again) == 2
    assert again[0]["coordinatorEpoch"] != again[1]["coordinatorEpoch"]
    assert {k: v for k, v in again[0].items() if k != "coordinatorEpoch"} == {
        k: v for k, v in again[1].items() if k != "coordinatorEpoch"
    }
    (saved,) = pi_session.harness.query(
        "SELECT stop_reason, response_session_entry_id FROM workflow_turns "
        "WHERE workflow_turn_id = ?",
        first_end["workflowTurnId"],
    )
    assert saved == ("completed", first_end["responseSessionEntryId"])
    # 7.20: the reply that arrived during the start acknowledgement is the end's response.
    terminal_turn = starts[3]
    reports = _turn_reports(relay, workflowTurnId=terminal_turn)
    assert [p["state"] for p in reports] == ["started", "ended"]
    assert reports[1]["responseSessionEntryId"] is not None
    (saved,) = pi_session.harness.query(
        "SELECT response_session_entry_id FROM workflow_turns WHERE workflow_turn_id = ?",
        terminal_turn,
    )
    assert saved == (reports[1]["responseSessionEntryId"],)


@pytest.mark.scenario("7.12", "7.17")
def test_a_turn_the_host_does_not_grant_is_never_reported_as_ended(
    pi_session: WorkflowPi, relay: Relay
):
    """7.12 and 7.17: the run is paused while the start report travels; the receipt says
    `absent`, so the Pi run is an ordinary one: its submission is refused, no end is sent."""
    release = relay.hold_request(
        lambda r: r["operation"] == "workflowTurn.report" and r["payload"]["state"] == "started"
    )
    pi_session.server.script(
        submit("inspect", {"findings": ["README.md"], "repoSummary": "demo"}),
        Text("The run seems to be paused."),
    )
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id, PI_WORKFLOWS_CLI=relay.cli)
    pi.prompt("/workflow start two-turn")
    wait_until(lambda: _turn_reports(relay, state="started"), timeout=60, what="the start report")
    (run,) = pi_session.runs()
    pi_session.harness.cli("run", "pause", run["runId"])
    release.set()

    pi.wait_for(
        lambda e: e.get("type") == "agent_end" and "seems to be paused" in json.dumps(e),
        timeout=60,
        what="the end of the ungranted turn",
    )
    (refused,) = pi_session.server.requests[1].tool_results()
    assert "paused" in refused["content"]
    (start,) = _turn_reports(relay, state="started")
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's reply")
    assert _turn_reports(relay, workflowTurnId=start["workflowTurnId"]) == [start]
    assert pi_session.turns(session_id) == []
    status = json.loads(pi_session.harness.cli("run", "status", run["runId"], "--json").stdout)
    assert status["paused"] is True


@pytest.mark.scenario("7.14")
def test_a_new_pi_gets_its_own_turn_accepted_instead_of_taking_over_an_open_one(
    pi_session: WorkflowPi, relay: Relay
):
    """7.14: the new pi's view shows the dead pi's turn still open on the step it had sent;
    the new pi's first model turn is a turn of its own — a new id, started and granted
    (`active`) before it counts, ended once — and the dead pi's turn is never reported by
    it (the host ends that one as lost)."""
    pi_session.server.script(
        Hold(),
        submit("reply", {"reply": "bonjour"}),
        Text("Replied."),
        Text("The echo workflow completed."),
    )
    session_id = f"pi-session-{uuid.uuid4().hex}"
    first = pi_session.start(session_id)  # straight to the host: the relay logs the second
    first.prompt('/workflow start echo {"task": "Say hello"}')
    pi_session.server.wait_for_requests(1, timeout=60)  # the first pi's model call is held
    wait_until(
        lambda: [t[2] for t in pi_session.turns(session_id)] == ["started"],
        timeout=60,
        what="the host to grant the first pi's turn",
    )
    ((dead_turn, *_),) = pi_session.turns(session_id)
    os.killpg(first.pid, signal.SIGKILL)
    wait_until(lambda: process_gone(first.pid), what="the first pi to die")

    second = pi_session.start(session_id, PI_WORKFLOWS_CLI=relay.cli)
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    # The dead pi's turn ends lost; the new pi's step turn ends completed, or lost when the
    # run finished first (the host settles a finished run's open turns), its last completed.
    wait_until(
        lambda: (
            len(turns := pi_session.turns(session_id)) == 3
            and all(t[2] == "ended" for t in turns)
            and [turns[0][3], turns[2][3]] == ["lost", "completed"]
        ),
        what="the dead pi's turn and the new pi's two turns to end",
    )
    reports = [r["payload"] for r in relay.requests_for("workflowTurn.report")]
    assert all(report["workflowTurnId"] != dead_turn for report in reports)
    first_report = reports[0]
    assert first_report["state"] == "started"
    ids = [report["workflowTurnId"] for report in reports]
    assert sorted(Counter(ids).values()) == [2, 2]  # each new turn: one start, one end
    new_turns = {t[0] for t in pi_session.turns(session_id)} - {dead_turn}
    assert new_turns == set(ids)
    assert pi_session.shown_once(second)


@pytest.mark.scenario("7.16")
def test_an_accepted_turn_outlives_the_view_that_drops_its_message(
    pi_session: WorkflowPi, relay: Relay
):
    """7.16: the run is cancelled while Pi's model turn on its step runs; the host ends
    the turn lost and its views drop the open message, but the extension keeps the turn
    until Pi's agent end and reports that end then: one start, one end."""
    pi_session.server.script(Hold(then=Text("Stopped.")), Text("The echo workflow was cancelled."))
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id, PI_WORKFLOWS_CLI=relay.cli)
    pi.prompt('/workflow start echo {"task": "Say hello"}')
    pi_session.server.wait_for_requests(1, timeout=60)  # the step's model call is held
    (start,) = wait_until(
        lambda: _turn_reports(relay, state="started"), timeout=60, what="the step's turn start"
    )
    turn = start["workflowTurnId"]
    seen = len(relay.events)
    (run,) = pi_session.runs()
    pi_session.harness.cli("run", "cancel", run["runId"])

    def dropped(event: dict) -> bool:
        view = event.get("payload") or {}
        return event.get("event") == "session_snapshot" and view.get("openWorkflowTurn") is None

    wait_until(lambda: any(dropped(e) for e in relay.events[seen:]), what="a view without the turn")
    assert _turn_reports(relay, workflowTurnId=turn) == [start]  # still Pi's turn

    pi_session.server.release_holds()
    wait_until(
        lambda: len(_turn_reports(relay, workflowTurnId=turn)) == 2, what="the turn's end report"
    )
    _, end = _turn_reports(relay, workflowTurnId=turn)
    # Reported at Pi's agent end, with the reply the released model gave, not at the drop.
    assert end["state"] == "ended" and end["stopReason"] == "completed"
    assert end["responseSessionEntryId"] is not None
    ((_, _, state, stop_reason),) = [t for t in pi_session.turns(session_id) if t[0] == turn]
    assert (state, stop_reason) == ("ended", "lost")  # the host had settled it at the cancel


@pytest.mark.scenario("4.19")
def test_a_start_whose_answer_is_late_is_given_up_and_its_retry_adopted(
    pi_session: WorkflowPi, relay: Relay
):
    """4.19: the host's answer to `/workflow start` is held past the extension's request
    timeout (30 s; 5 s here, through PI_WORKFLOWS_REQUEST_TIMEOUT_MS). The extension stops
    waiting and sends the start again, with a new request id under the same idempotency
    key; the host adopts it (one run), and the first answer, released late, changes
    nothing."""
    late = relay.hold_reply(lambda r: r["operation"] == "run.start")
    pi_session.server.script(
        submit("reply", {"reply": "bonjour"}),
        Text("Replied."),
        Text("The echo workflow completed."),
    )
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(
        session_id, PI_WORKFLOWS_CLI=relay.cli, PI_WORKFLOWS_REQUEST_TIMEOUT_MS="5000"
    )
    # The command waits for its start's answer (pi answers the prompt after it): no wait here.
    pi.write({"type": "prompt", "message": '/workflow start echo {"task": "Say hello"}'})

    first, retry = wait_until(
        lambda: (sent := relay.requests_for("run.start"))[1:] and sent,
        timeout=90,
        what="the extension to give up on the first answer and send the start again",
    )
    # The first answer reaches the extension now, after it gave up on it (the relay keeps
    # a connection's frames in order); the retry's answer, adopted, follows.
    late.set()
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert f"Started echo: run {run['runId']}" in pi_session.notices(pi)
    assert first["requestId"] != retry["requestId"]
    assert first["idempotencyKey"] == retry["idempotencyKey"]
    assert first["payload"] == retry["payload"]
    assert run["status"] == "completed", run
    assert [r["runId"] for r in pi_session.runs()] == [run["runId"]]  # adopted: one run
    assert pi_session.harness.query(
        "SELECT request_id, outcome FROM host_commands WHERE operation = 'run.start'"
    ) == [(first["requestId"], "accepted")]
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")
    assert pi.process.poll() is None  # the late answer did not upset the extension
