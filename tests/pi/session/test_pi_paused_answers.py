"""A person's `/workflow answer` to a paused run is refused until `/workflow resume`."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.pi.model_server import Text
from tests.pi.session.workflow_pi import WorkflowPi
from tests.polling import wait_until


@pytest.mark.scenario("5.1")
def test_a_person_cannot_answer_a_paused_runs_decision_until_it_is_resumed(
    pi_session: WorkflowPi,
):
    pi_session.server.script(Text("The plan was approved and the workflow completed."))
    pi = pi_session.start(f"pi-session-{uuid.uuid4().hex}")
    pi.prompt('/workflow start human-decision {"goal": "ship 1.0"}')
    wait_until(
        lambda: any(e["customType"] == "pi-workflows-interaction" for e in pi_session.entries(pi)),
        timeout=60,
        what="the decision card",
    )

    # Paused once it waits for the answer (a pause racing the run's own move to `waiting`
    # is another matter).
    pi_session.wait_for_run("waiting")
    pi.prompt("/workflow pause")
    wait_until(lambda: pi_session.wait_for_run("waiting")["paused"], what="the pause")
    seen = len(pi_session.notices(pi))
    pi.prompt("/workflow answer continue")
    refused = wait_until(lambda: pi_session.notices(pi)[seen:], what="the refusal")[0]
    assert "Workflow run is paused" in refused, refused
    (decision,) = json.loads(pi_session.harness.cli("decision", "list", "--json").stdout)
    assert decision["status"] == "pending"

    pi.prompt("/workflow resume")
    wait_until(lambda: not pi_session.wait_for_run("waiting")["paused"], what="the resume")
    pi.prompt("/workflow answer continue")
    run = pi_session.wait_for_run("completed", timeout=60)
    assert run["finalOutput"] == {"decision": {"choice": "continue"}}
    (answered,) = json.loads(pi_session.harness.cli("decision", "list", "--all", "--json").stdout)
    assert answered["resolution"]["channel"] == "session"
