"""Human decisions on a real host: answers, deadlines, one winner, cancellation, restarts."""

from __future__ import annotations

import json
import threading

import pytest

from pi_workflows.client import HostConnection

from .conftest import HostHarness, decision_workflow, pending_decision, wait_past, wait_until

SESSION = "session-under-test"


def _start_decision_run(harness: HostHarness, after_ms: int | None, session: bool = False) -> str:
    harness.write_workflow("decide", decision_workflow(after_ms))
    args = ["run", "start", "decide", "--project", str(harness.project), "--no-autostart"]
    if session:
        args += ["--session", SESSION]
    run_id = harness.cli(*args).stdout.strip()
    harness.wait_for_status(run_id, "waiting")
    return run_id


def _answer(harness: HostHarness, decision_id: str, *args: str):
    return harness.cli("decision", "answer", decision_id, *args, "--json", check=False)


def _resolutions(harness: HostHarness, decision_id: str) -> list[tuple]:
    return harness.query(
        "SELECT provenance, channel, continuation_run_id FROM human_decision_resolutions "
        "WHERE decision_id = ?",
        decision_id,
    )


def _continuation(harness: HostHarness, decision_id: str) -> str:
    """Wait until the decision's continuation is reserved; returns its run id."""
    return wait_until(
        lambda: (rows := _resolutions(harness, decision_id)) and rows[0][2],
        what=f"the continuation of {decision_id}",
    )


@pytest.mark.scenario("1.18", "10.3", "10.6")
def test_an_answer_before_the_deadline_routes_on_its_choice(harness: HostHarness):
    harness.start_host()
    run_id = _start_decision_run(harness, 60_000, session=True)
    listed = json.loads(harness.cli("decision", "list", "--json").stdout)
    (decision,) = [d for d in listed if d["runId"] == run_id]
    assert set(decision) == {
        "decisionId",
        "runId",
        "nodeId",
        "audience",
        "title",
        "choices",
        "status",
        "deadline",
        "defaultResponse",
        "resolution",
    }
    assert decision["status"] == "pending" and decision["deadline"]
    assert decision["defaultResponse"] == {"choice": "stop"} and decision["resolution"] is None
    assert "secret-plan" not in json.dumps(harness.client().run_status(run_id))
    decision_id = decision["decisionId"]
    assert decision_id.startswith("decision-")
    # The session channel delivered a `decision` message to the origin session.
    wait_until(
        lambda: harness.query(
            "SELECT status FROM workflow_messages WHERE kind = 'decision' AND source_id = ?",
            decision_id,
        ),
        what="the session's decision message",
    )
    submit = harness.client().send(
        "interaction.submit",
        {"requestId": decision_id, "submissionId": "model-1", "value": {"choice": "ship"}},
        run_id=run_id,
    )
    assert submit.outcome != "accepted"

    missing = _answer(harness, decision_id, "replan")
    assert missing.returncode == 1 and "needs its text input 'why'" in missing.stdout
    answered = _answer(harness, decision_id, "replan", "--input", "smaller steps")
    assert answered.returncode == 0, answered.stdout
    receipt = json.loads(answered.stdout)["receipt"]
    child = receipt["continuationRunId"]
    assert child == "continuation-" + decision_id.removeprefix("decision-")
    final = harness.wait_for_status(child, "completed")["finalOutput"]
    assert final == {
        "route": "replan",
        "answer": {"choice": "replan", "input": {"why": "smaller steps"}},
    }

    repeat = _answer(harness, decision_id, "replan", "--input", "smaller steps")
    assert json.loads(repeat.stdout)["outcome"] == "adopted"
    late = _answer(harness, decision_id, "ship")
    assert late.returncode == 1
    body = json.loads(late.stdout)
    assert body["outcome"] == "conflict" and body["receipt"]["winner"]["channel"] == "cli"
    assert "already resolved by" in body["error"]
    assert body["receipt"]["winner"]["resolvedAt"] in body["error"]
    assert harness.query(
        "SELECT status FROM workflow_messages WHERE kind = 'decision' AND source_id = ?",
        decision_id,
    ) == [("cancelled",)]
    assert len(_resolutions(harness, decision_id)) == 1


@pytest.mark.scenario("10.6", "10.8", "10.15")
def test_the_deadline_applies_the_default_and_a_later_answer_learns_the_winner(
    harness: HostHarness,
):
    harness.start_host()
    run_id = _start_decision_run(harness, 600)
    decision_id = pending_decision(harness, run_id)["decisionId"]
    child = _continuation(harness, decision_id)
    final = harness.wait_for_status(child, "completed")["finalOutput"]
    assert final == {"route": "stop", "answer": {"choice": "stop"}}
    assert _resolutions(harness, decision_id) == [("timeout", None, child)]

    late = json.loads(_answer(harness, decision_id, "ship").stdout)
    assert late["outcome"] == "conflict"
    assert late["receipt"]["winner"]["provenance"] == "timeout"
    assert "its timeout default" in late["error"]


@pytest.mark.scenario("10.9")
def test_simultaneous_answers_from_two_channels_have_one_winner(harness: HostHarness):
    harness.start_host()
    run_id = _start_decision_run(harness, None, session=True)
    decision = pending_decision(harness, run_id)
    assert decision["deadline"] is None and decision["defaultResponse"] is None
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def answer(channel: str, choice: str) -> None:
        client = harness.client()
        source = {"channel": channel}
        if channel == "session":
            source["sessionId"] = SESSION
        client.host_status()  # connect before the race starts
        barrier.wait()
        results[channel] = client.answer_decision(decision["decisionId"], choice, **source)
        client.close()

    threads = [
        threading.Thread(target=answer, args=("cli", "ship")),
        threading.Thread(target=answer, args=("session", "stop")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    outcomes = sorted(r.outcome for r in results.values())
    assert outcomes == ["accepted", "conflict"]
    winner = next(c for c, r in results.items() if r.outcome == "accepted")
    loser = results["session" if winner == "cli" else "cli"]
    assert loser.receipt["winner"]["channel"] == winner
    assert len(_resolutions(harness, decision["decisionId"])) == 1
    child = results[winner].receipt["continuationRunId"]
    route = harness.wait_for_status(child, "completed")["finalOutput"]["route"]
    assert route == {"cli": "ship", "session": "stop"}[winner]


@pytest.mark.scenario("10.7", "5.8")
def test_cancelling_the_run_cancels_its_open_decision(harness: HostHarness):
    harness.start_host()
    run_id = _start_decision_run(harness, 60_000)
    decision_id = pending_decision(harness, run_id)["decisionId"]
    harness.cli("run", "cancel", run_id)
    listed = json.loads(harness.cli("decision", "list", "--all", "--json").stdout)
    (decision,) = [d for d in listed if d["decisionId"] == decision_id]
    assert decision["status"] == "cancelled"
    assert decision["resolution"]["provenance"] == "cancellation"
    late = json.loads(_answer(harness, decision_id, "ship").stdout)
    assert late["outcome"] == "conflict" and "cancellation of its run" in late["error"]
    assert harness.query("SELECT COUNT(*) FROM runs WHERE parent_run_id = ?", run_id) == [(0,)]


@pytest.mark.integration
@pytest.mark.scenario("10.10")
def test_a_host_restarted_across_the_deadline_applies_the_default_once(harness: HostHarness):
    harness.start_host()
    run_id = _start_decision_run(harness, 2_500)
    decision = pending_decision(harness, run_id)
    harness.stop()
    harness.start_host()
    child = _continuation(harness, decision["decisionId"])
    harness.wait_for_status(child, "completed")
    harness.stop()
    harness.start_host()
    assert len(_resolutions(harness, decision["decisionId"])) == 1
    accepted = harness.query(
        "SELECT COUNT(*) FROM events WHERE run_id = ? AND event_type = 'human_decision.accepted'",
        run_id,
    )
    assert accepted == [(1,)]
    assert harness.query("SELECT COUNT(*) FROM runs WHERE parent_run_id = ?", run_id) == [(1,)]


@pytest.mark.integration
def test_a_host_down_at_the_deadline_applies_it_at_startup(harness: HostHarness):
    harness.start_host()
    run_id = _start_decision_run(harness, 1_000)
    decision = pending_decision(harness, run_id)
    harness.stop()
    wait_past(decision["deadline"])
    harness.start_host()
    # Startup applies deadlines before the host listens: the first answer sees it.
    assert [r[0] for r in _resolutions(harness, decision["decisionId"])] == ["timeout"]
    child = "continuation-" + decision["decisionId"].removeprefix("decision-")
    assert harness.wait_for_status(child, "completed")["finalOutput"]["route"] == "stop"


@pytest.mark.integration
@pytest.mark.scenario("1.19", "10.5")
def test_a_restarted_host_leaves_a_waiting_decision_run_to_its_answer(harness: HostHarness):
    harness.start_host()
    run_id = _start_decision_run(harness, None)
    decision_id = pending_decision(harness, run_id)["decisionId"]
    harness.stop()
    # Read after the stop: the worker that parked the run has exited by then.
    workers = harness.workers(run_id)
    harness.start_host()
    # Once a run started after the restart has completed, the claim passes have been
    # past the waiting run: it was not claimed or relaunched.
    later = harness.start_run("hello", {"name": "later"})
    harness.wait_for_status(later, "completed")
    assert harness.client().run_status(run_id)["status"] == "waiting"
    assert harness.query("SELECT status FROM run_queue WHERE run_id = ?", run_id) == [("parked",)]
    assert harness.workers(run_id) == workers

    with HostConnection(harness.home.socket_path) as connection:
        first = connection.request(
            "decision.answer", {"decisionId": decision_id, "choice": "ship"}, idempotency_key="same"
        )
        reused = connection.request(
            "decision.answer", {"decisionId": decision_id, "choice": "stop"}, idempotency_key="same"
        )
    assert first.outcome == "accepted", first
    assert reused.outcome == "conflict" and "Idempotency key was reused" in reused.error
    child = first.receipt["continuationRunId"]
    assert harness.wait_for_status(child, "completed")["finalOutput"]["route"] == "ship"
    assert len(_resolutions(harness, decision_id)) == 1


@pytest.mark.scenario("10.4")
def test_an_answer_after_the_deadline_loses_to_the_default_before_the_timer_fires(
    harness: HostHarness,
):
    # Deadlines are applied by the poll timer; with a slow one, only the answer's own
    # check sees that the deadline has passed.
    harness.start_host(PI_WORKFLOWS_POLL_S="600")
    run_id = _start_decision_run(harness, 1_000)
    decision = pending_decision(harness, run_id)
    wait_past(decision["deadline"])
    assert _resolutions(harness, decision["decisionId"]) == []

    late = json.loads(_answer(harness, decision["decisionId"], "ship").stdout)

    assert late["outcome"] == "conflict", late
    assert late["receipt"]["winner"]["provenance"] == "timeout"
    ((provenance, channel, child),) = _resolutions(harness, decision["decisionId"])
    assert (provenance, channel) == ("timeout", None)
    assert harness.wait_for_status(child, "completed")["finalOutput"]["route"] == "stop"
