"""`run.start`s sent together commit together, and each is still its own command."""

from __future__ import annotations

import time

from pi_workflows.client import HostConnection
from pi_workflows.client.start_request import start_payload

from .conftest import HostHarness, request_frame, send_together, wait_until
from .workflows import STEPS


def _frame(request_id: str, payload: dict) -> bytes:
    return request_frame(request_id, "run.start", payload, client_id="burst-client")


def test_a_refused_start_among_starts_sent_together_is_refused_alone(harness: HostHarness):
    harness.start_host()
    good = start_payload("hello", harness.project, {"name": "Ada"})
    relative = {**good, "projectPath": "relative/project"}
    answers, _ = send_together(
        harness,
        [
            _frame("s-1", good),
            _frame("s-2", relative),
            _frame("s-1", good),  # a retry of s-1 inside the same burst adopts it
            _frame("s-3", good),
        ],
    )
    outcomes = [(answer["requestId"], answer["outcome"]) for answer in answers]
    assert outcomes == [
        ("s-1", "accepted"),
        ("s-2", "rejected"),
        ("s-1", "adopted"),
        ("s-3", "accepted"),
    ]
    assert "projectPath must be absolute" in answers[1]["error"]
    assert answers[2]["receipt"] == answers[0]["receipt"]
    runs = {row[0] for row in harness.query("SELECT run_id FROM runs")}
    assert runs == {answers[0]["receipt"]["runId"], answers[3]["receipt"]["runId"]}
    stored = harness.query("SELECT request_id, outcome FROM host_commands ORDER BY request_id")
    assert stored == [("s-1", "accepted"), ("s-3", "accepted")]  # the refusal left nothing


def test_starts_sent_together_claim_no_more_runs_than_the_host_has_workers(
    harness: HostHarness,
):
    harness.write_workflow("steps", STEPS)
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="2")
    payload = start_payload("steps", harness.project)
    answers, _ = send_together(harness, [_frame(f"s-{i}", payload) for i in range(6)])
    assert {answer["outcome"] for answer in answers} == {"accepted"}

    # Both workers reach b and wait there; the four other runs wait for a slot.
    wait_until(
        lambda: harness.query("SELECT COUNT(*) FROM run_queue WHERE status = 'running'") == [(2,)],
        what="two runs running",
    )
    assert harness.query("SELECT COUNT(DISTINCT run_id) FROM run_workers") == [(2,)]
    assert harness.query("SELECT COUNT(*) FROM run_queue WHERE status = 'queued'") == [(4,)]

    (harness.project / "release-b").touch()
    for answer in answers:
        assert harness.wait_for_run(answer["receipt"]["runId"])["status"] == "completed"


def test_a_pipelining_client_gets_every_answer_in_order(harness: HostHarness):
    harness.start_host()
    good = start_payload("hello", harness.project, {"name": "Ada"})
    payloads = [good] * 40  # more than one window of 32
    payloads[17] = {**good, "projectPath": "relative/project"}
    client = harness.client()
    try:
        responses = client.start_runs_pipelined(payloads)
    finally:
        client.close()
    assert [r.outcome for r in responses] == ["accepted"] * 17 + ["rejected"] + ["accepted"] * 22
    run_ids = [r.receipt["runId"] for r in responses if r.ok]
    assert len(set(run_ids)) == 39
    assert {row[0] for row in harness.query("SELECT run_id FROM runs")} == set(run_ids)
    # A retry of the pipeline on a new connection of the same client adopts.
    with HostConnection(harness.home.socket_path, client_id=client.client_id) as connection:
        again = connection.request_pipelined(
            "run.start", [good], [responses[0].request_id], window=1
        )
    assert again[0].outcome == "adopted"
    assert again[0].receipt == responses[0].receipt


def test_a_client_streaming_starts_goes_first_but_never_stops_the_running_runs(
    harness: HostHarness,
):
    harness.start_host(PI_WORKFLOWS_MAX_WORKERS="1")
    payload = start_payload("hello", harness.project, {"name": "Ada"})
    client = harness.client()
    try:
        first = client.start_run(payload)["runId"]
        # One start after another, each after the previous answer (worker messages wait
        # for each next one, CommitGroup.hold), until the run started first is done.
        started = 0
        deadline = time.monotonic() + 30
        while harness.query("SELECT status FROM runs WHERE run_id = ?", first) != [("completed",)]:
            assert time.monotonic() < deadline, "the running run starved behind the starts"
            assert client.start_run(payload)["status"] == "queued"
            started += 1
    finally:
        client.close()
    assert started > 0
