"""Checkpoints: an answer reserves the deterministic continuation; a repeat adopts."""

from __future__ import annotations

import json

import pytest

from tests.host.workflows import CHECKPOINTED

from .conftest import HostHarness


@pytest.mark.scenario("1.18", "2.10", "2.11", "9.13")
def test_checkpoint_answer_continues_and_a_repeat_adopts(harness: HostHarness):
    harness.write_workflow("checkpointed", CHECKPOINTED)
    harness.start_host()
    parent = harness.start_run("checkpointed")
    harness.wait_for_status(parent, "waiting")

    answer = harness.cli("checkpoint", "answer", parent, "--input-json", '{"ok": true}', "--json")
    receipt = json.loads(answer.stdout)
    child = receipt["runId"]
    assert child.startswith("continuation-") and receipt["parentRunId"] == parent
    status = harness.wait_for_status(child, "completed")
    assert status["finalOutput"] == {"answer": {"ok": True}}
    assert status["parentRunId"] == parent

    again = json.loads(
        harness.cli("checkpoint", "answer", parent, "--input-json", '{"ok": true}', "--json").stdout
    )
    assert again == {"parentRunId": parent, "runId": child, "alreadyAnswered": True}
    other = harness.cli("checkpoint", "answer", parent, "--input-json", '"no"', check=False)
    assert other.returncode == 1 and "conflicts" in other.stderr
    assert harness.query("SELECT COUNT(*) FROM runs WHERE parent_run_id = ?", parent) == [(1,)]
    assert harness.query("SELECT status FROM run_queue WHERE run_id = ?", parent) == [("done",)]
    assert harness.client().run_status(parent)["statusDetail"] == f"Answered; continued by {child}"
    assert harness.client().host_status()["lifecycleContradictions"] == 0
