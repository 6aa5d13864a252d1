"""What the host sends is checked before the extension reads it (issue 22.8): a malformed
answer or session view is one clear notice, and the Pi session goes on working."""

from __future__ import annotations

import uuid

from tests.pi.model_server import Hold
from tests.pi.session.relay import Relay
from tests.pi.session.workflow_pi import WorkflowPi, two_turn_script
from tests.polling import wait_until


def _operation(name: str):
    return lambda request: request["operation"] == name


def test_malformed_answers_and_views_are_clear_notices_and_the_session_goes_on(
    pi_session: WorkflowPi, relay: Relay
):
    relay.rewrite_reply(
        _operation("run.start"),
        lambda frame: {**frame, "receipt": {**frame["receipt"], "runId": 42}},
    )
    relay.rewrite_event(
        lambda frame: frame.get("event") == "session_snapshot" and frame["payload"]["run"],
        lambda frame: {**frame, "payload": {**frame["payload"], "workflowMessages": "none"}},
    )
    relay.rewrite_reply(_operation("run.status"), lambda frame: {**frame, "outcome": "maybe"})
    first, *rest = two_turn_script()
    pi_session.server.script(Hold(then=first), *rest)
    session_id = f"pi-session-{uuid.uuid4().hex}"
    pi = pi_session.start(session_id, PI_WORKFLOWS_CLI=relay.cli)

    def notice(text: str) -> str:
        return pi.wait_for(
            lambda e: e.get("method") == "notify" and text in e.get("message", ""), what=text
        )["message"]

    pi.prompt("/workflow start two-turn")
    assert notice("run.start") == (
        "pi-workflows: The workflow host sent an invalid answer to run.start: receipt.runId is "
        "not text."
    )
    assert notice("invalid session view") == (
        "pi-workflows: the workflow host sent an invalid session view (view.workflowMessages "
        "is not a list); it was ignored."
    )
    pi_session.server.wait_for_requests(1, timeout=60)  # the first step is being worked on
    pi.prompt("/workflow status")
    assert notice("run.status") == (
        "pi-workflows: The workflow host sent an invalid answer to run.status: unknown "
        'outcome "maybe".'
    )
    pi_session.server.release_holds()
    # The run the host did start is delivered whole by the same Pi.
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    wait_until(lambda: pi_session.server.remaining() == 0, what="the model's last reply")
    assert len(pi_session.shown_once(pi)) == 4
    assert pi.process.poll() is None
