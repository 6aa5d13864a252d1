"""A paused run refuses every answer and its decision deadline waits (reference: decisions.md
§3.3 and client-protocol.md §4: a paused run → `conflict` "Workflow run is paused")."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from tests.host.workflows import CHECKPOINTED

from .conftest import (
    HostHarness,
    decision_workflow,
    pending_decision,
    wait_past,
    wait_until,
    write_channels,
)

PAUSED = "Workflow run is paused"

# A channel that answers "ship" as `ops` when <answer-now> appears, and writes what
# `report_answer` returned to <answered> (one JSON line per answer).
ANSWERING_CHANNEL = """
import json
import threading
from pathlib import Path

from pi_workflows import hookimpl


class Answering:
    def __init__(self, context):
        self.context = context
        self.trigger = Path(context.options["trigger"])
        self.answered = Path(context.options["answered"])
        self.stop = threading.Event()

    def deliver(self, request):
        threading.Thread(target=self._answer_on_trigger, args=(request["decisionId"],)).start()
        return {"shown": True}

    def _answer_on_trigger(self, decision_id):
        while not self.stop.wait(0.02):
            if self.trigger.exists():
                self.trigger.unlink()
                result = self.context.report_answer(decision_id, "ship", actor="ops")
                with self.answered.open("a") as out:
                    out.write(json.dumps(result) + "\\n")

    def settle(self, request, resolution, delivery):
        return {}

    def close(self):
        self.stop.set()


@hookimpl
def piw_register_decision_channels(register):
    register("answering", Answering)
"""


def _start_paused_decision(harness: HostHarness, after_ms: int | None) -> tuple[str, str]:
    harness.write_workflow("decide", decision_workflow(after_ms))
    harness.start_host()
    run_id = harness.start_run("decide")
    harness.wait_for_status(run_id, "waiting")
    decision_id = pending_decision(harness, run_id)["decisionId"]
    paused = json.loads(harness.cli("run", "pause", run_id, "--json").stdout)
    assert paused["paused"] is True
    return run_id, decision_id


def _refused_as_paused(result) -> None:
    assert result.returncode == 1
    assert PAUSED in result.stdout + result.stderr


def _resolutions(harness: HostHarness, decision_id: str) -> list[tuple]:
    return harness.query(
        "SELECT provenance, continuation_run_id FROM human_decision_resolutions "
        "WHERE decision_id = ?",
        decision_id,
    )


def _deadline_ms(decision: dict) -> float:
    return datetime.fromisoformat(decision["deadline"].replace("Z", "+00:00")).timestamp() * 1000


@pytest.mark.integration
@pytest.mark.scenario("5.1")
def test_a_paused_run_refuses_answers_and_its_deadline_does_not_fire_until_resumed(
    harness: HostHarness,
):
    # 5 s: time enough to pause the run before the deadline on a loaded machine.
    run_id, decision_id = _start_paused_decision(harness, 5000)
    paused_by = time.time()  # the pause committed before this
    _refused_as_paused(harness.cli("decision", "answer", decision_id, "ship", check=False))
    before = pending_decision(harness, run_id)
    assert before["status"] == "pending"

    # The deadline passes while no host runs; the next host applies deadlines at startup,
    # before it listens, and must leave this one alone.
    harness.stop()
    wait_past(before["deadline"])
    harness.start_host()
    assert pending_decision(harness, run_id)["status"] == "pending"
    assert _resolutions(harness, decision_id) == []
    status = harness.client().run_status(run_id)
    assert status["status"] == "waiting" and status["paused"] is True

    resuming_at = time.time()  # the resume commits after this
    resumed = json.loads(harness.cli("run", "resume", run_id, "--json").stdout)
    assert resumed["paused"] is False and resumed["waitingForAnswer"] is True
    assert harness.client().run_status(run_id)["paused"] is False
    # The paused time is given back: the deadline moved on by at least the time the host
    # was down (the default may have won already on a slow machine).
    after = pending_decision(harness, run_id)
    assert _deadline_ms(after) >= _deadline_ms(before) + (resuming_at - paused_by) * 1000

    child = wait_until(
        lambda: (rows := _resolutions(harness, decision_id)) and rows[0][1],
        what="the default answer after resume",
    )
    assert _resolutions(harness, decision_id) == [("timeout", child)]
    final = harness.wait_for_status(child, "completed")["finalOutput"]
    assert final == {"route": "stop", "answer": {"choice": "stop"}}


@pytest.mark.scenario("5.1")
def test_a_paused_run_refuses_channel_answers_and_takes_them_after_resume(
    harness: HostHarness,
):
    trigger, answered = harness.root / "answer-now", harness.root / "answered"
    harness.add_plugin("answering_channel", ANSWERING_CHANNEL)
    options = {"kind": "answering", "trigger": str(trigger), "answered": str(answered)}
    write_channels(
        harness, {"audiences": {"operator": ["cli", "desk"]}, "channels": {"desk": options}}
    )
    run_id, decision_id = _start_paused_decision(harness, None)

    trigger.touch()
    refused = json.loads(wait_until(lambda: answered.exists() and answered.read_text()))
    assert refused["outcome"] == "conflict" and PAUSED in refused["error"]
    assert _resolutions(harness, decision_id) == []
    # A session's client (as `/workflow answer` in Pi sends it) is refused the same way.
    via_client = harness.client().answer_decision(decision_id, "ship")
    assert via_client.outcome == "conflict" and PAUSED in via_client.error

    harness.cli("run", "resume", run_id)
    answered.unlink()
    trigger.touch()
    accepted = json.loads(wait_until(lambda: answered.exists() and answered.read_text()))
    assert accepted["outcome"] == "accepted", accepted
    child = accepted["receipt"]["continuationRunId"]
    final = harness.wait_for_status(child, "completed")["finalOutput"]
    assert final == {"route": "ship", "answer": {"choice": "ship"}}
    assert _resolutions(harness, decision_id) == [("human", child)]


@pytest.mark.scenario("5.1")
def test_a_paused_runs_checkpoint_refuses_its_answer_until_resumed(harness: HostHarness):
    harness.write_workflow("checkpointed", CHECKPOINTED)
    harness.start_host()
    parent = harness.start_run("checkpointed")
    harness.wait_for_status(parent, "waiting")
    harness.cli("run", "pause", parent)

    refused = harness.cli(
        "checkpoint", "answer", parent, "--input-json", '{"ok": true}', check=False
    )
    _refused_as_paused(refused)
    assert harness.query("SELECT COUNT(*) FROM runs WHERE parent_run_id = ?", parent) == [(0,)]
    status = harness.client().run_status(parent)
    assert status["status"] == "waiting" and status["paused"] is True

    resumed = json.loads(harness.cli("run", "resume", parent, "--json").stdout)
    assert resumed["paused"] is False and resumed["waitingForAnswer"] is True
    answer = harness.cli("checkpoint", "answer", parent, "--input-json", '{"ok": true}', "--json")
    child = json.loads(answer.stdout)["runId"]
    assert harness.wait_for_status(child, "completed")["finalOutput"] == {"answer": {"ok": True}}
    assert harness.query("SELECT status FROM run_queue WHERE run_id = ?", parent) == [("done",)]


# A worker that lingers after it exits: the host sees its process (a shell around the
# worker) end only once the test creates <release> in the project.
LINGERING_WORKER = """
import sys
from dataclasses import replace

from pi_workflows import hookimpl
from pi_workflows.plugin import default_worker_process

LINGER = '"$0" -m pi_workflows.worker; s=$?; until [ -e release ]; do sleep 0.05; done; exit $s'


@hookimpl
def piw_worker_process(envelope, settings):
    spec = default_worker_process(envelope, settings)
    return replace(spec, argv=["sh", "-c", LINGER, sys.executable], forkable=False)
"""


@pytest.mark.scenario("5.1")
def test_a_paused_checkpoint_resumes_while_its_worker_is_still_exiting(harness: HostHarness):
    # A worker's own write makes the run wait; its process exits a moment later. A pause
    # and a resume in that moment must undo the pause, not answer "already running".
    harness.write_workflow("checkpointed", CHECKPOINTED)
    harness.add_plugin("lingering_worker", LINGERING_WORKER)
    harness.start_host()
    parent = harness.start_run("checkpointed")
    harness.wait_for_status(parent, "waiting")
    assert harness.client().host_status()["activeWorkers"] == 1  # its worker is still there
    assert json.loads(harness.cli("run", "pause", parent, "--json").stdout)["paused"] is True

    resumed = json.loads(harness.cli("run", "resume", parent, "--json").stdout)

    assert resumed["paused"] is False and resumed["waitingForAnswer"] is True, resumed
    assert harness.client().run_status(parent)["paused"] is False
    (harness.project / "release").touch()
    answer = harness.cli("checkpoint", "answer", parent, "--input-json", '{"ok": true}', "--json")
    child = json.loads(answer.stdout)["runId"]
    assert harness.wait_for_status(child, "completed")["finalOutput"] == {"answer": {"ok": True}}
