"""The session extension across failures: a killed host, a killed or second `pi`, no host."""

from __future__ import annotations

import json
import os
import signal
import socket
import uuid
from collections import Counter

import pytest

from tests.pi.model_server import Hold, Text
from tests.pi.offline_pi import PiHome
from tests.pi.session.workflow_pi import CLI, WorkflowPi, submit, two_turn_script
from tests.polling import process_gone, wait_until


@pytest.mark.integration
@pytest.mark.scenario("1.11")
def test_a_host_killed_mid_step_is_replaced_and_the_run_completes_without_duplicates(
    pi_session: WorkflowPi,
):
    script = two_turn_script()
    # The draft step's model turn is in progress when the host dies; it submits afterwards.
    script[2] = Hold(then=script[2])
    pi_session.server.script(*script)
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id)
    pi.prompt("/workflow start two-turn")
    pi_session.server.wait_for_requests(3, timeout=60)
    # Kill once the draft step waits durably and its worker is gone (a worker killed before
    # its waiting snapshot is another scenario: the engine resumes from the node's start).
    harness = pi_session.harness
    wait_until(
        lambda: (
            harness.query(
                "SELECT 1 FROM node_attempts WHERE node_id = 'draft' AND status = 'waiting'"
            )
            and not harness.query(
                "SELECT 1 FROM run_workers WHERE status IN ('starting', 'ready', 'running')"
            )
        ),
        what="the draft step waiting with no worker",
    )
    old_host = pi_session.harness.host_process
    os.kill(old_host.pid, signal.SIGKILL)
    old_host.wait()
    # The extension finds no host, starts one through the CLI and coordinates again.
    wait_until(
        lambda: pi_session.harness._answers(), timeout=60, what="a new host started by the session"
    )
    pi_session.server.release_holds()

    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")
    wait_until(
        lambda: (
            len(pi_session.turns(session_id)) == 4
            and all(t[2] == "ended" for t in pi_session.turns(session_id))
        ),
        what="four ended turns",
    )
    hosted = pi_session.host_messages(session_id)
    assert [m["kind"] for m in hosted] == ["step", "step", "step", "terminal"]
    assert pi_session.shown_once(pi) == Counter(m["workflowMessageId"] for m in hosted)
    # The turn the outage interrupted ended once, as the model ended it: nothing was lost.
    assert pi_session.turns_ended_as(session_id, ["completed"] * 4)
    assert not any("unreachable" in n for n in pi_session.notices(pi)[1:])


def test_a_killed_pi_is_replaced_by_a_new_pi_on_the_same_session(pi_session: WorkflowPi):
    pi_session.server.script(Hold(), *two_turn_script())
    session_id = f"pi-session-{uuid.uuid4().hex}"
    first = pi_session.start(session_id)
    first.prompt("/workflow start two-turn")
    pi_session.server.wait_for_requests(1, timeout=60)
    # The model request can precede the turn-start report: kill only once the host owns it.
    wait_until(
        lambda: [t[2] for t in pi_session.turns(session_id)] == ["started"],
        what="the host to record the turn the killed pi was in",
    )
    os.killpg(first.pid, signal.SIGKILL)
    wait_until(lambda: process_gone(first.pid), what="the first pi to die")

    second = pi_session.start(session_id)
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")

    # The model can answer the terminal message before the host records it as sent.
    def through_terminal_sent() -> list[dict] | None:
        messages = pi_session.host_messages(session_id)
        last = messages[-1] if messages else {}
        return messages if (last.get("kind"), last.get("status")) == ("terminal", "sent") else None

    hosted = wait_until(
        through_terminal_sent, interval=0.2, what="the terminal message recorded as sent"
    )
    # The killed pi's step was shown again to the new pi (a `resumed` step).
    assert [(m["kind"], m["status"]) for m in hosted][:2] == [
        ("step", "sent"),
        ("step", "cancelled"),
    ]
    assert [m["details"].get("reason") for m in hosted if m["status"] == "sent"] == [
        "initial",
        "resumed",
        "initial",
        "initial",
        None,
    ]
    shown = pi_session.shown_once(second)
    assert set(shown) == {m["workflowMessageId"] for m in hosted if m["status"] == "sent"} - {
        hosted[0]["workflowMessageId"]
    }
    wait_until(
        lambda: (
            all(t[2] == "ended" for t in pi_session.turns(session_id))
            and len(pi_session.turns(session_id)) == 5
        ),
        what="five ended turns",
    )
    # The dead pi's turn ended lost exactly once; the new pi's four turns completed.
    assert pi_session.turns_ended_as(session_id, ["lost"] + ["completed"] * 4)
    (counted,) = pi_session.harness.query(
        "SELECT unproductive_turn_ends FROM interactive_requests WHERE node_id = 'inspect'"
    )
    assert counted == (1,)


def test_a_second_pi_on_the_same_session_fences_the_first(pi_session: WorkflowPi):
    pi_session.server.script(Hold(), *two_turn_script())
    session_id = f"pi-session-{uuid.uuid4().hex}"
    first = pi_session.start(session_id)
    first.prompt("/workflow start two-turn")
    pi_session.server.wait_for_requests(1, timeout=60)

    second = pi_session.start(session_id)
    first.wait_for(
        lambda e: e.get("method") == "notify" and "took over" in e.get("message", ""),
        what="the takeover notice",
    )
    # The first pi goes idle again: it must not deliver anything from now on.
    assert first.send({"type": "abort"})["success"]
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")

    first_shown = [e["details"]["workflowMessageId"] for e in pi_session.entries(first)]
    hosted = pi_session.host_messages(session_id)
    assert first_shown == [hosted[0]["workflowMessageId"]]
    assert len(pi_session.shown_once(first, second)) == 5
    assert [n for n in pi_session.notices(first) if "took over" in n] == [TOOK_OVER]


TOOK_OVER = (
    "pi-workflows: another Pi process took over this workflow session; "
    "this one no longer delivers its workflow messages."
)
TAKEN_BACK = (
    "pi-workflows: the Pi process that took over this workflow session is gone; "
    "this one coordinates it again."
)


def test_a_fenced_pi_takes_the_session_back_when_the_pi_that_took_over_is_killed(
    pi_session: WorkflowPi,
):
    """Issue 22.12: the fence lasts only as long as the Pi process that set it."""
    session_id = f"pi-session-{uuid.uuid4().hex}"
    first = pi_session.start(session_id)
    first.prompt("/workflow status")  # answered once the first pi coordinates the session
    first.wait_for(
        lambda e: "has no workflow run" in e.get("message", ""), what="the first pi's status"
    )
    second = pi_session.start(session_id)
    first.wait_for(lambda e: e.get("message") == TOOK_OVER, what="the takeover notice")

    os.killpg(second.pid, signal.SIGKILL)
    wait_until(lambda: process_gone(second.pid), what="the second pi to die")
    first.wait_for(lambda e: e.get("message") == TAKEN_BACK, what="the take-back notice")

    # The first pi coordinates again: it starts a run and delivers all of it.
    pi_session.server.script(*two_turn_script())
    first.prompt("/workflow start two-turn")
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")
    hosted = pi_session.host_messages(session_id)
    assert len(pi_session.shown_once(first)) == len(hosted) == 4
    notices = pi_session.notices(first)
    assert notices.count(TOOK_OVER) == 1 and notices.count(TAKEN_BACK) == 1, notices
    assert not [n for n in notices if "Another Pi process coordinates" in n], notices


def test_a_provider_that_is_down_fails_the_run_once_with_a_notice_naming_the_model(
    harness, model_server, pi_bin
):
    """Issue 24.5: with Pi's own retries on (a user's default), a workflow turn that fails
    on the provider fails the run at once, naming provider and model; no reminders, and
    Pi's retry of the turn is cancelled."""
    pi_session = WorkflowPi(
        harness, PiHome(harness.root / "pi", model_server, retries_off=False), model_server
    )
    harness.start_host()
    try:
        model_server.stop()
        session_id = f"pi-session-{uuid.uuid4().hex}"
        pi = pi_session.start(session_id)
        pi.prompt("/workflow echo Say hello")
        run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=60)
        failure = "The model scripted/scripted-model failed: Connection error."
        assert (run["status"], run["errorCode"], run["error"]) == (
            "failed",
            "modelFailed",
            failure,
        ), run
        notice = f"pi-workflows: the workflow run echo {run['runId']} failed: {failure}"
        pi.wait_for(lambda e: e.get("message") == notice, what="the failed-run notice")
        # The step, then the result for the model to explain (which fails the same way).
        wait_until(
            lambda: pi_session.turns_ended_as(session_id, ["error", "error"]),
            what="the step's and the result's turns to end",
        )
        assert [m["kind"] for m in pi_session.host_messages(session_id)] == ["step", "terminal"]

        # Pi began its automatic retry of each failed turn; each one was cancelled.
        def retry_events():
            return [e for e in pi.events if e.get("type", "").startswith("auto_retry")]

        wait_until(lambda: len(retry_events()) >= 4, what="both retries to be cancelled")
        retries = retry_events()
        assert [e["type"] for e in retries] == ["auto_retry_start", "auto_retry_end"] * 2
        assert {e.get("finalError") for e in retries[1::2]} == {"Retry cancelled"}
        assert pi_session.notices(pi).count(notice) == 1
    finally:
        pi_session.close()


def test_an_unreachable_host_is_one_notice_and_pi_keeps_working(pi_session: WorkflowPi):
    pi_session.harness.stop()
    pi_session.server.script(Text("Still here."))
    pi = pi_session.start(PI_WORKFLOWS_CLI=f"{CLI} --no-autostart")
    warning = pi.wait_for(
        lambda e: e.get("method") == "notify" and "unreachable" in e.get("message", ""),
        what="the unreachable notice",
    )
    assert warning["notifyType"] == "warning"
    pi.prompt("Are you there?")
    end = pi.wait_for_type("agent_end")
    assert end["messages"][-1]["content"][0]["text"] == "Still here."
    assert sum("unreachable" in n for n in pi_session.notices(pi)) == 1

    # Retries go on in the background: a host that comes back is found, without a second
    # unreachable notice.
    pi_session.harness.start_host()
    pi.wait_for(
        lambda e: e.get("method") == "notify" and "again" in e.get("message", ""),
        timeout=30,
        what="the reconnected notice",
    )
    assert sum("unreachable" in n for n in pi_session.notices(pi)) == 1


def _fill_connection_slots(harness, count: int) -> list[socket.socket]:
    """`count` silent connections the host greeted, each holding one of its slots."""
    held: list[socket.socket] = []
    while len(held) < count:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(harness.home.socket_path))
        if json.loads(sock.makefile("rb").readline())["type"] == "hello":
            held.append(sock)
        else:  # a slot a finished client was still giving back
            sock.close()
    return held


def test_a_host_that_refuses_the_connection_is_one_notice_and_the_session_reconnects(
    pi_session: WorkflowPi, relay
):
    harness = pi_session.harness
    harness.stop()
    harness.start_host(PI_WORKFLOWS_MAX_CONNECTIONS="3")
    held = _fill_connection_slots(harness, 3)
    try:
        # The relay stands in for `pi socket`, so the extension's own connection is the one
        # the host refuses (with its `refused` frame).
        pi = pi_session.start(PI_WORKFLOWS_CLI=relay.cli)
        warning = pi.wait_for(
            lambda e: e.get("method") == "notify" and "refused" in e.get("message", ""),
            what="the refusal notice",
        )
        assert warning["notifyType"] == "warning"
        assert "too many connections (limit 3)" in warning["message"]
        pi_session.server.script(Text("Still here."))
        pi.prompt("Are you there?")
        end = pi.wait_for_type("agent_end")
        assert end["messages"][-1]["content"][0]["text"] == "Still here."
    finally:
        for sock in held:
            sock.close()
    # Slots free up: the retries in the background get in, and the session works.
    pi.wait_for(
        lambda e: e.get("method") == "notify" and "again" in e.get("message", ""),
        timeout=30,
        what="the reconnected notice",
    )
    assert sum("refused" in n or "unreachable" in n for n in pi_session.notices(pi)) == 1
    pi_session.server.script(submit("reply", {"reply": "hello"}), Text("Done."))
    pi.prompt('/workflow start echo {"task": "Say hello"}')
    run = pi_session.wait_for_run("completed", "failed", "cancelled")
    assert (run["status"], run["finalOutput"]) == ("completed", {"reply": "hello"})
    assert pi.process.poll() is None
