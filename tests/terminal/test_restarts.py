"""`run restart`: lineage, limits, refusals, adoption, and `earlierOutcomes` along a chain."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.host.conftest import HostHarness, wait_until

from .helpers import SESSION, start_interactive, terminal_messages
from .workflows import COUNTING, GATED, STOPPED_PAYMENT


def _show_terminal(harness: HostHarness, run_id: str) -> None:
    """Show the session's messages (`session next`) up to the run's terminal message."""
    for _ in range(5):
        message = json.loads(harness.cli("session", "next", SESSION, "--json").stdout)
        if (message["kind"], message["runId"]) == ("terminal", run_id):
            return
    raise AssertionError(f"the terminal message of {run_id} was never shown")


def _revision(harness: HostHarness, run_id: str) -> int:
    client = harness.client()
    try:
        return client.run_status(run_id)["revision"]
    finally:
        client.close()


def _restart(harness: HostHarness, run_id: str) -> dict:
    client = harness.client()
    try:
        return client.restart_run(run_id, _revision(harness, run_id))
    finally:
        client.close()


def _send_restart(harness: HostHarness, run_id: str, revision: int | None, **payload: str):
    client = harness.client()
    try:
        return client.send("run.restart", payload, run_id=run_id, expected_revision=revision)
    finally:
        client.close()


def _refusal(harness: HostHarness, run_id: str, **payload: str) -> str:
    response = _send_restart(harness, run_id, _revision(harness, run_id), **payload)
    assert response.outcome == "rejected", response
    return response.error


def _cli_restart(harness: HostHarness, run_id: str) -> subprocess.CompletedProcess:
    return harness.cli("run", "restart", run_id, "--json", check=False)


def _facts(harness: HostHarness, run_id: str) -> dict:
    found = wait_until(lambda: terminal_messages(harness, run_id), what="a terminal message")
    assert len(found) == 1
    return found[0]["details"]["terminal"]


@pytest.mark.scenario("8.9")
def test_a_restart_chain_runs_fresh_adopts_repeats_and_stops_after_three(harness: HostHarness):
    harness.write_workflow("counting", COUNTING)
    harness.start_host()
    chain = [start_interactive(harness, "counting")]
    harness.wait_for_status(chain[0], "completed")
    for number in (1, 2, 3):
        _facts(harness, chain[-1])  # a restart is about the run's terminal message
        _show_terminal(harness, chain[-1])
        receipt = _restart(harness, chain[-1])
        assert receipt["parentRunId"] == chain[-1]
        assert receipt["restartNumber"] == number
        assert receipt["runId"].startswith("restart-")
        assert _restart(harness, chain[-1]) == receipt  # a repeat adopts the child
        chain.append(receipt["runId"])
        status = harness.wait_for_status(receipt["runId"], "completed")
        # A fresh start with the same input, not a continuation of the parent's state.
        assert status["finalOutput"] == {"run": number + 1}
        assert status["restartNumber"] == number and status["parentRunId"] == chain[-2]

    last = _facts(harness, chain[-1])
    _show_terminal(harness, chain[-1])
    assert last["restartNumber"] == 3
    assert last["earlierOutcomes"] == [
        {
            "runId": run_id,
            "status": "completed",
            "reason": None,
            "finalOutput": {"run": n},
            "error": None,
        }
        for n, run_id in enumerate(chain[:-1], start=1)
    ]
    assert _refusal(harness, chain[-1]) == "Workflow restart limit reached (3 restarts)"
    assert json.loads(_cli_restart(harness, chain[0]).stdout)["runId"] == chain[1]
    refused = _cli_restart(harness, chain[-1])
    assert refused.returncode == 1
    assert refused.stderr.strip() == "Error: Workflow restart limit reached (3 restarts)"


@pytest.mark.scenario("8.8", "A.6")
def test_restarts_refused_for_cancelled_headless_unfinished_and_repeated_outcomes(
    harness: HostHarness,
):
    harness.start_host()
    waiting = start_interactive(harness, "echo", {"task": "never answered"})
    harness.wait_for_status(waiting, "waiting")
    assert "only a finished run can be restarted" in _refusal(harness, waiting)
    harness.cli("run", "cancel", waiting)
    _facts(harness, waiting)
    assert _refusal(harness, waiting) == "An explicitly cancelled workflow cannot be restarted"

    headless = harness.start_run("hello")
    harness.wait_for_status(headless, "completed")
    assert "interactive" in _refusal(harness, headless)

    # hello always produces the same outcome: its restart repeats it, so no second restart.
    first = start_interactive(harness, "hello", {"name": "Ed"})
    harness.wait_for_status(first, "completed")
    first_facts = _facts(harness, first)
    _show_terminal(harness, first)
    assert "stale or was replaced" in _refusal(
        harness, first, workflowMessageId="workflow-message-x"
    )
    second = _restart(harness, first)["runId"]
    harness.wait_for_status(second, "completed")
    second_facts = _facts(harness, second)
    assert second_facts["terminalFingerprint"] == first_facts["terminalFingerprint"]
    assert second_facts["earlierOutcomes"][0]["runId"] == first
    _show_terminal(harness, second)
    assert "same terminal outcome already occurred" in _refusal(harness, second)


@pytest.mark.scenario("8.13", "A.6")
def test_a_restart_needs_the_exact_revision_and_a_terminal_message_its_session_showed(
    harness: HostHarness,
):
    harness.start_host()
    run_id = start_interactive(harness, "hello", {"name": "Ada"})
    harness.wait_for_status(run_id, "completed")
    _facts(harness, run_id)
    unshown = _refusal(harness, run_id)
    assert unshown.startswith("Workflow terminal result is stale or was replaced")
    assert "pi-workflows session next SESSION" in unshown
    _show_terminal(harness, run_id)
    revision = _revision(harness, run_id)

    def children() -> list[tuple]:
        return harness.query("SELECT run_id FROM runs WHERE parent_run_id = ?", run_id)

    missing = _send_restart(harness, run_id, None)
    assert missing.outcome == "rejected" and "requires expectedRevision" in missing.error
    stale = _send_restart(harness, run_id, revision + 1)
    assert stale.outcome == "conflict"
    assert stale.error.startswith("Workflow run revision changed")
    refused = harness.cli(
        "run", "restart", run_id, "--expected-revision", str(revision + 1), check=False
    )
    assert refused.returncode == 1 and "Workflow run revision changed" in refused.stderr
    assert children() == []  # nothing was created

    client = harness.client()
    first = client.send(
        "run.restart", {}, run_id=run_id, expected_revision=revision, idempotency_key="restart-1"
    )
    repeat = client.send(
        "run.restart", {}, run_id=run_id, expected_revision=revision, idempotency_key="restart-1"
    )
    client.close()
    assert first.outcome == "accepted"
    assert first.receipt["parentRunId"] == run_id and first.receipt["restartNumber"] == 1
    assert repeat.outcome == "adopted" and repeat.receipt == first.receipt
    # The CLI passes the revision it reads: the existing child is adopted.
    again = json.loads(_cli_restart(harness, run_id).stdout)
    assert again["runId"] == first.receipt["runId"]
    assert children() == [(first.receipt["runId"],)]
    status = harness.wait_for_status(first.receipt["runId"], "completed")
    assert status["parentRunId"] == run_id and status["restartNumber"] == 1


@pytest.mark.scenario("8.13")
def test_a_run_with_an_effect_in_doubt_cannot_be_restarted(harness: HostHarness):
    harness.write_workflow("stopped-payment", STOPPED_PAYMENT)
    harness.start_host()
    run_id = start_interactive(harness, "stopped-payment")
    status = harness.wait_for_status(run_id, "timed_out", "failed", "completed")
    assert status["status"] in ("timed_out", "failed")
    _facts(harness, run_id)
    _show_terminal(harness, run_id)
    [effect] = json.loads(harness.cli("effects", "list", "--run", run_id, "--json").stdout)
    assert effect["status"] == "ambiguous"

    refused = _cli_restart(harness, run_id)
    assert refused.returncode == 1
    assert "Workflow run has unsettled effects" in refused.stderr
    assert f"pi-workflows effects list --run {run_id}" in refused.stderr
    harness.cli("effects", "confirm", effect["effectId"])
    restarted = json.loads(_cli_restart(harness, run_id).stdout)
    assert restarted["parentRunId"] == run_id


def test_earlier_outcomes_follow_continuations_and_restarts(harness: HostHarness):
    harness.write_workflow("gated", GATED)
    harness.start_host()
    gate = start_interactive(harness, "gated")
    failures: list[str] = []
    for attempt in (1, 2, 3):
        harness.wait_for_status(gate, "waiting")
        answer = json.dumps({"attempt": attempt})
        continued = harness.cli("checkpoint", "answer", gate, "--input-json", answer)
        continuation = continued.stdout.strip().splitlines()[-1]
        status = harness.wait_for_status(continuation, "completed", "failed")
        facts = _facts(harness, continuation)
        assert [o["runId"] for o in facts["earlierOutcomes"]] == failures
        assert facts["restartNumber"] == attempt - 1
        if attempt < 3:
            assert status["status"] == "failed"
            failures.append(continuation)
            _show_terminal(harness, continuation)
            gate = _restart(harness, continuation)["runId"]  # the restart waits at the gate

    assert facts["status"] == "completed"
    assert facts["finalOutput"] == {"attempt": 3, "answer": {"attempt": 3}}
    assert [o["error"] for o in facts["earlierOutcomes"]] == [
        "Node 'try' failed: RuntimeError: attempt 1 failed",
        "Node 'try' failed: RuntimeError: attempt 2 failed",
    ]
    # Runs that only waited at the gate never ended, so they have no terminal message.
    waited = harness.query("SELECT run_id FROM runs WHERE status = 'waiting'")
    assert len(waited) == 3
    assert all(not terminal_messages(harness, run_id) for (run_id,) in waited)
