"""`run restart`: lineage, limits, refusals, adoption, and `earlierOutcomes` along a chain."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.host.conftest import HostHarness, wait_until

from .helpers import start_interactive, terminal_messages
from .workflows import COUNTING, GATED


def _restart(harness: HostHarness, run_id: str) -> dict:
    client = harness.client()
    try:
        return client.restart_run(run_id)
    finally:
        client.close()


def _refusal(harness: HostHarness, run_id: str, **payload: str) -> str:
    client = harness.client()
    try:
        response = client.send("run.restart", payload, run_id=run_id)
    finally:
        client.close()
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


@pytest.mark.scenario("8.8")
def test_restarts_refused_for_cancelled_headless_unfinished_and_repeated_outcomes(
    harness: HostHarness,
):
    harness.start_host()
    waiting = start_interactive(harness, "echo", {"task": "never answered"})
    harness.wait_for_status(waiting, "waiting")
    assert "only a finished run can be restarted" in _refusal(harness, waiting)
    harness.cli("run", "cancel", waiting)
    _facts(harness, waiting)
    assert "cancelled workflow run cannot be restarted" in _refusal(harness, waiting)

    headless = harness.start_run("hello")
    harness.wait_for_status(headless, "completed")
    assert "interactive" in _refusal(harness, headless)

    # hello always produces the same outcome: its restart repeats it, so no second restart.
    first = start_interactive(harness, "hello", {"name": "Ed"})
    harness.wait_for_status(first, "completed")
    first_facts = _facts(harness, first)
    assert "stale or was replaced" in _refusal(
        harness, first, workflowMessageId="workflow-message-x"
    )
    second = _restart(harness, first)["runId"]
    harness.wait_for_status(second, "completed")
    second_facts = _facts(harness, second)
    assert second_facts["terminalFingerprint"] == first_facts["terminalFingerprint"]
    assert second_facts["earlierOutcomes"][0]["runId"] == first
    assert "same terminal outcome already occurred" in _refusal(harness, second)


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
