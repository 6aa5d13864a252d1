"""Exactly one terminal message per ended interactive run, on every path that ends one.

Real host, real workers, real SQLite; messages are read through the storage API.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from peewee import fn

from pi_workflows.builtin.terminal import (
    BLOCKED_GUIDANCE,
    DEFAULT_INSTRUCTIONS,
    GUARDRAILS,
    PREAMBLE,
)
from pi_workflows.canonical import canonical_json, digest
from pi_workflows.clock import now_ms
from pi_workflows.safety_wording import SAFETY_SENTENCES
from pi_workflows.storage import put_json
from pi_workflows.storage.models import WorkflowMessage, WorkflowTurn
from pi_workflows.storage.terminal_facts import LOAD_FAILURE_DETAIL, terminal_message_id
from tests.host.conftest import HostHarness, wait_until
from tests.host.workflows import BLOCKER

from .helpers import SESSION, start_interactive, terminal_message_count, terminal_messages
from .workflows import FAILING, LOAD_BROKEN, RENDER_FAULT_PLUGIN


def _only_terminal_message(harness: HostHarness, run_id: str) -> dict:
    found = wait_until(lambda: terminal_messages(harness, run_id), what="a terminal message")
    assert len(found) == 1, found
    return found[0]


@pytest.mark.scenario("8.3", "8.5")
def test_a_completed_run_gets_the_reference_layout(harness: HostHarness):
    harness.start_host()
    run_id = start_interactive(harness, "hello", {"name": "Ada"})
    harness.wait_for_status(run_id, "completed")
    message = _only_terminal_message(harness, run_id)

    facts = message["details"]["terminal"]
    assert facts == {
        "schema": "pi-workflows.terminal-result.v1",
        "runId": run_id,
        "workflowName": "hello",
        "workflowRef": "hello",
        "input": {"name": "Ada"},
        "status": "completed",
        "finalOutput": {"greeting": "Hello, Ada!"},
        "error": None,
        "reason": None,
        "restartNumber": 0,
        "earlierOutcomes": [],
        "terminalFingerprint": facts["terminalFingerprint"],
    }
    fingerprint = digest(
        {k: facts[k] for k in ("workflowRef", "input", "status", "finalOutput", "error", "reason")}
    )
    assert facts["terminalFingerprint"] == fingerprint
    assert message["workflowMessageId"] == terminal_message_id(run_id, fingerprint)
    assert message["details"]["workflowMessageId"] == message["workflowMessageId"]
    assert message["content"].split("\n") == [
        PREAMBLE,
        DEFAULT_INSTRUCTIONS,
        *GUARDRAILS,
        "",
        "Workflow result:",
        canonical_json(facts),
    ]
    assert message["status"] == "pending"


def test_the_terminal_language_setting_translates_the_safety_wording(harness: HostHarness):
    harness.start_host(PI_WORKFLOWS_TERMINAL_LANGUAGE="de")
    run_id = start_interactive(harness, "hello", {"name": "Ada"})
    harness.wait_for_status(run_id, "completed")
    message = _only_terminal_message(harness, run_id)

    german = SAFETY_SENTENCES["de"]
    assert message["content"].split("\n") == [
        "Fahre in dieser Sitzung fort.",
        german.default_instructions,
        *german.guardrails,
        "",
        "Workflow-Ergebnis:",
        canonical_json(message["details"]["terminal"]),
    ]
    assert len(german.guardrails) == len(GUARDRAILS)  # translated whole, none left out


@pytest.mark.integration
@pytest.mark.scenario("3.8", "8.2")
def test_every_path_that_ends_a_run_writes_exactly_one_terminal_message(harness: HostHarness):
    harness.write_workflow("failing", FAILING)
    harness.write_workflow("blocker", BLOCKER)
    harness.write_workflow("broken", LOAD_BROKEN)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1")
    ended: dict[str, str] = {}

    ended["failed"] = start_interactive(harness, "failing")
    harness.wait_for_status(ended["failed"], "failed")

    ended["load failure"] = start_interactive(harness, "broken")
    status = harness.wait_for_status(ended["load failure"], "failed")
    assert status["errorCode"] == "workflowLoadFailed"

    # Cancel an active run, and a queued one that waits behind it (max one worker).
    ended["cancelled active"] = start_interactive(harness, "blocker")
    harness.wait_for_pid("blocker.pid")
    # (from another session: one session holds one unfinished run at a time)
    ended["cancelled queued"] = start_interactive(harness, "hello", session="session-queued")
    assert harness.client().run_status(ended["cancelled queued"])["queueStatus"] == "queued"
    harness.cli("run", "cancel", ended["cancelled queued"])
    harness.cli("run", "cancel", ended["cancelled active"])

    # Cancel a parked run: an agent step parks an interactive run for its session.
    ended["cancelled parked"] = start_interactive(harness, "echo", {"task": "say hi"})
    harness.wait_for_status(ended["cancelled parked"], "waiting")
    harness.cli("run", "cancel", ended["cancelled parked"])

    ended["completed"] = start_interactive(harness, "hello", {"name": "Bo"})
    harness.wait_for_status(ended["completed"], "completed")
    headless = harness.start_run("hello", {"name": "nobody listens"})
    harness.wait_for_status(headless, "completed")

    for path, run_id in ended.items():
        facts = _only_terminal_message(harness, run_id)["details"]["terminal"]
        assert facts["status"] == harness.client().run_status(run_id)["status"], path
    failed = terminal_messages(harness, ended["failed"])[0]["details"]["terminal"]
    assert "the widget exploded" in failed["error"]
    load_failure = terminal_messages(harness, ended["load failure"])[0]["details"]["terminal"]
    assert load_failure["reason"] == LOAD_FAILURE_DETAIL
    assert "a dependency of this workflow is missing" in load_failure["error"]
    assert terminal_message_count(harness, headless) == 0
    # The load failure failed the run at once: one worker, never a replacement, and
    # restoring the file does not bring the run back.
    assert [w[1] for w in harness.workers(ended["load failure"])] == ["crashed"]
    harness.write_workflow("broken", LOAD_BROKEN.replace("raise ImportError", "print"))
    refused = harness.cli("run", "resume", ended["load failure"], check=False)
    assert refused.returncode == 1 and "already terminal" in refused.stderr, refused.stderr
    assert harness.client().run_status(ended["load failure"])["status"] == "failed"

    # A new host finds nothing missing and duplicates nothing.
    harness.stop()
    harness.start_host()
    for run_id in [*ended.values(), headless]:
        assert terminal_message_count(harness, run_id) == (run_id != headless)
    assert [w[1] for w in harness.workers(ended["load failure"])] == ["crashed"]


def _add_session_traffic(harness: HostHarness, run_id: str) -> None:
    """What a session would have left behind: a sent message with an open turn, plus
    pending step, decision and follow-up messages."""
    store = harness.open_store()
    try:
        with store.transaction():
            now = now_ms()
            content_hash = put_json({"text": "session traffic", "details": {}})
            last = (
                WorkflowMessage.select(fn.MAX(WorkflowMessage.order_number))
                .where(WorkflowMessage.target_session_id == SESSION)
                .scalar()
            )
            rows = [
                ("sent-step", "step", "sent", "entry-1"),
                ("pending-step", "step", "pending", None),
                ("pending-decision", "decision", "pending", None),
                ("pending-follow-up", "followUp", "pending", None),
            ]
            for order, (name, kind, status, entry) in enumerate(rows, start=(last or 0) + 1):
                WorkflowMessage.create(
                    workflow_message_id=f"{name}-{run_id}",
                    run=run_id,
                    target_session_id=SESSION,
                    kind=kind,
                    source_id=name,
                    idempotency_key="k",
                    content_hash=content_hash,
                    order_number=order,
                    status=status,
                    session_entry_id=entry,
                    created_at=now,
                    updated_at=now,
                )
            WorkflowTurn.create(
                workflow_turn_id=f"turn-{run_id}",
                workflow_message=f"sent-step-{run_id}",
                run=run_id,
                target_session_id=SESSION,
                state="started",
                started_at=now,
            )
    finally:
        store.close()


def _cleanup_state(harness: HostHarness, run_id: str) -> dict[str, str]:
    rows = harness.query(
        "SELECT workflow_message_id, status FROM workflow_messages WHERE run_id = ?"
        " AND workflow_message_id LIKE '%-' || run_id",
        run_id,
    )
    state = {message_id.removesuffix(f"-{run_id}"): status for message_id, status in rows}
    turn = harness.query(
        "SELECT state, stop_reason FROM workflow_turns WHERE workflow_turn_id = ?", f"turn-{run_id}"
    )
    state["turn"] = ":".join(turn[0])
    return state


@pytest.mark.scenario("11.14", "5.8", "7.9")
def test_ending_a_run_ends_its_turns_lost_and_cancels_messages_by_kind(harness: HostHarness):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    cancelled = start_interactive(harness, "echo", {"task": "wait for me"})
    harness.wait_for_status(cancelled, "waiting")
    _add_session_traffic(harness, cancelled)
    harness.cli("run", "cancel", cancelled)
    assert _cleanup_state(harness, cancelled) == {
        "sent-step": "sent",
        "pending-step": "cancelled",
        "pending-decision": "cancelled",
        "pending-follow-up": "cancelled",
        "turn": "ended:lost",
    }

    # Success keeps follow-ups: they are work the user queued for after the run.
    completed = start_interactive(harness, "blocker")
    harness.wait_for_pid("blocker.pid")
    _add_session_traffic(harness, completed)
    (harness.project / "release").touch()
    harness.wait_for_status(completed, "completed")
    assert _cleanup_state(harness, completed) == {
        "sent-step": "sent",
        "pending-step": "cancelled",
        "pending-decision": "cancelled",
        "pending-follow-up": "pending",
        "turn": "ended:lost",
    }
    assert len(terminal_messages(harness, completed)) == 1


def _fault_env(harness: HostHarness, tmp_path: Path, failure: str) -> dict[str, str]:
    (tmp_path / "render_fault.py").write_text(RENDER_FAULT_PLUGIN)
    return {
        "PI_WORKFLOWS_PLUGINS": "render_fault",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "RENDER_CALLS": str(tmp_path / "render-calls"),
        "RENDER_FAILURE": failure,
    }


@pytest.mark.hook_effect("piw_render_terminal_message")
@pytest.mark.scenario("5.5", "8.1", "A.3")
def test_a_failing_renderer_never_loses_the_terminal_state_or_the_message(
    harness: HostHarness, tmp_path: Path
):
    harness.start_host(**_fault_env(harness, tmp_path, "raise"))
    run_id = start_interactive(harness, "hello", {"name": "Cy"})
    harness.wait_for_status(run_id, "completed")
    completed_at = time.monotonic()
    wait_until(lambda: terminal_message_count(harness, run_id), timeout=2.0, what="reconciliation")
    assert time.monotonic() - completed_at < 2.0
    assert int((tmp_path / "render-calls").read_text()) == 2
    assert terminal_message_count(harness, run_id) == 1
    assert f"terminal workflow message reconciliation failed for {run_id}" in harness.host_log()


@pytest.mark.integration
@pytest.mark.scenario("8.1", "A.3")
def test_a_host_killed_before_the_message_writes_it_before_serving_again(
    harness: HostHarness, tmp_path: Path
):
    env = _fault_env(harness, tmp_path, "kill")
    host = harness.start_host(**env)
    run_id = start_interactive(harness, "hello", {"name": "Di"})
    host.wait(timeout=30)
    assert harness.query("SELECT status FROM runs WHERE run_id = ?", run_id) == [("completed",)]
    assert terminal_message_count(harness, run_id) == 0

    harness.start_host(**env)
    # start_host returns once the host answers its first request: the message must
    # already be there, because discovery runs before the socket listens.
    assert terminal_message_count(harness, run_id) == 1
    assert int((tmp_path / "render-calls").read_text()) == 2


BIG_RESULT = """
from pi_workflows import compute, workflow

WORKFLOW = workflow(
    name="big-result",
    start_at="make",
    nodes={"make": compute(lambda ctx: {"rows": ["x" * 100] * 3000})},
    edges=[],
)
"""


@pytest.mark.scenario("8.7")
def test_a_large_result_is_cut_in_the_terminal_message_and_whole_in_run_status(
    harness: HostHarness,
):
    harness.write_workflow("big-result", BIG_RESULT)
    harness.start_host()
    run_id = start_interactive(harness, "big-result", {"note": "n" * 40_000})
    harness.wait_for_status(run_id, "completed")
    message = _only_terminal_message(harness, run_id)

    marker = "[result truncated; inspect workflow status for the complete result]"
    assert marker in message["content"]
    assert "[input truncated; inspect workflow status for the complete input]" in message["content"]
    assert len(canonical_json(message).encode()) < 64 * 1024  # the result alone is 300 KiB
    facts = message["details"]["terminal"]
    assert facts["status"] == "completed" and facts["finalOutput"].endswith(marker)
    assert facts["finalOutput"].startswith('{"rows":["xxxx')
    # The fingerprint is over the whole facts, so the message identity is unchanged.
    whole = {
        "workflowRef": "big-result",
        "input": {"note": "n" * 40_000},
        "status": "completed",
        "finalOutput": {"rows": ["x" * 100] * 3000},
        "error": None,
        "reason": None,
    }
    assert facts["terminalFingerprint"] == digest(whole)
    client = harness.client()
    try:
        assert client.run_status(run_id)["finalOutput"] == {"rows": ["x" * 100] * 3000}
    finally:
        client.close()


BLOCKED = """
from pi_workflows import compute, workflow

WORKFLOW = workflow(
    name="blocked",
    start_at="check",
    nodes={"check": compute(lambda ctx: {"status": "blocked", "why": "needs a licence"})},
    edges=[],
)
"""


@pytest.mark.scenario("8.7")
def test_a_completed_but_blocked_result_says_the_user_must_decide(harness: HostHarness):
    harness.write_workflow("blocked", BLOCKED)
    harness.start_host()
    run_id = start_interactive(harness, "blocked", {})
    harness.wait_for_status(run_id, "completed")
    lines = _only_terminal_message(harness, run_id)["content"].split("\n")

    assert lines[:2] == [PREAMBLE, DEFAULT_INSTRUCTIONS]
    assert lines[2] == BLOCKED_GUIDANCE
    assert lines[-1].startswith("{") and '"why":"needs a licence"' in lines[-1]
