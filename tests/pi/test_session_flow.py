"""A Pi session as a workflow session: the real `pi` in RPC mode with the extension loaded."""

from __future__ import annotations

from collections import Counter

from tests.pi.workflow_session import WorkflowPi, harness, pi_session, two_turn_script  # noqa: F401
from tests.polling import wait_until


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
        lambda: pi_session.turns(session_id) and all(t[2] == "ended" for t in pi_session.turns(session_id))
        and len(pi_session.turns(session_id)) == 4,
        what="four ended turns",
    )
    hosted = pi_session.host_messages(session_id)
    assert [m["kind"] for m in hosted] == ["step", "step", "step", "terminal"]
    assert all(m["status"] == "sent" for m in hosted)

    entries = pi_session.entries(pi)
    shown = Counter(e["details"]["workflowMessageId"] for e in entries)
    assert shown == Counter(m["workflowMessageId"] for m in hosted)  # each exactly once
    terminal = [e for e in entries if e["customType"] == "pi-workflows-presentation"]
    assert len(terminal) == 1 and terminal[0]["display"] is False
    steps = [e for e in entries if e["customType"] == "pi-workflows-step"]
    assert [e["details"]["step"] for e in steps] == ["inspect", "draft", "checklist"]

    last = pi_session.messages(pi)[-1]
    assert last["role"] == "assistant"
    assert last["content"][0]["text"] == "The two-turn workflow completed: a plan to add a changelog."
    assert [t[3] for t in pi_session.turns(session_id)] == ["completed"] * 4
