"""Slow requests: one does not hold up the requests after it on its connection (1.12),
and one whose connection dropped is adopted when the client sends it again (4.13/4.14)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pi_workflows.canonical import canonical_json
from pi_workflows.client import HostConnection
from pi_workflows.errors import HostUnavailableError
from pi_workflows.protocol.client_messages import SCHEMA
from tests.polling import wait_until

# The step's validator holds the submission until the test creates <project>/release.
SLOW_CHECK = """
import time
from pathlib import Path

from pi_workflows import agent, workflow


def held(output, ctx):
    deadline = time.monotonic() + 60
    while not (Path.cwd() / "release").exists():
        if time.monotonic() > deadline:
            raise ValueError("release never appeared")
        time.sleep(0.02)
    return output


WORKFLOW = workflow(
    name="slow-check", start_at="ask", nodes={"ask": agent("Answer.", validate=held)}, edges=[]
)
"""


def _frame(request_id: str, operation: str, payload: dict, **envelope: object) -> bytes:
    message = {
        "schema": SCHEMA,
        "type": "request",
        "requestId": request_id,
        "clientId": "slow-client",
        "operation": operation,
        "idempotencyKey": request_id,
        "payload": payload,
        **envelope,
    }
    return canonical_json(message).encode() + b"\n"


def _submit_frame(
    session,
    step: dict,
    run_id: str,
    request_id: str = "slow-submit",
    submission_id: str = "only",
    key: str | None = None,
) -> bytes:
    details = step["details"]
    interaction = next(
        i for i in session.view["pendingInteractions"] if i["requestId"] == details["requestId"]
    )
    return _frame(
        request_id,
        "interaction.submit",
        {
            "requestId": details["requestId"],
            "attempt": details["attempt"],
            "step": details["step"],
            "submissionId": submission_id,
            "value": {"answer": 42},
        },
        runId=run_id,
        expectedRevision=interaction["revision"],
        idempotencyKey=key or request_id,
    )


def _wait_until_validating(harness) -> None:
    wait_until(
        lambda: harness.query("SELECT outcome FROM interactive_submissions") == [("validating",)],
        what="the first submission to be validating",
    )


@contextlib.contextmanager
def _connect(harness) -> Iterator[tuple[socket.socket, Any]]:
    """A raw client connection past the host's hello."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(str(harness.home.socket_path))
        reader = sock.makefile("rb")
        assert json.loads(reader.readline())["type"] == "hello"
        yield sock, reader


@pytest.mark.scenario("1.12")
def test_status_is_answered_while_a_submission_on_the_same_connection_validates(sessions, harness):
    run_id, session, step = sessions.first_step("slow-check", SLOW_CHECK, "session-slow")
    session.report_turn(step, session.new_turn_id(), "started")
    submit = _submit_frame(session, step, run_id)

    with _connect(harness) as (sock, reader):
        sock.sendall(submit + _frame("quick-status", "host.status", {}))
        first = json.loads(reader.readline())  # the submission is still validating
        assert first["requestId"] == "quick-status" and first["outcome"] == "accepted"
        (harness.project / "release").touch()
        second = json.loads(reader.readline())
        assert second["requestId"] == "slow-submit" and second["outcome"] == "accepted", second
    harness.wait_for_status(run_id, "completed")


@pytest.mark.scenario("11.9", "4.14")
def test_a_submission_retried_after_its_connection_dropped_is_adopted(sessions, harness):
    """Reference 4.13/4.14: the client resends a request whose connection dropped with the
    same request id, idempotency key and payload; the host adopts the first submission."""
    run_id, session, step = sessions.first_step("slow-check", SLOW_CHECK, "session-retry")
    session.report_turn(step, session.new_turn_id(), "started")
    submit = _submit_frame(session, step, run_id)

    with _connect(harness) as (dropped, _):
        dropped.sendall(submit)
        _wait_until_validating(harness)
    with _connect(harness) as (retry, reader):
        retry.sendall(submit)
        (harness.project / "release").touch()
        answer = json.loads(reader.readline())
    assert answer["requestId"] == "slow-submit" and answer["outcome"] == "adopted", answer
    assert harness.query("SELECT idempotency_key, outcome FROM interactive_submissions") == [
        ("only", "accepted")
    ]
    harness.wait_for_status(run_id, "completed")


@pytest.mark.scenario("4.14")
def test_a_retry_with_new_ids_under_the_same_idempotency_key_is_adopted(sessions, harness):
    """Reference 4.14: another request id and another submission id, the same idempotency key:
    adopted, and only the first submission is stored."""
    run_id, session, step = sessions.first_step("slow-check", SLOW_CHECK, "session-key")
    session.report_turn(step, session.new_turn_id(), "started")
    first = _submit_frame(session, step, run_id, "first", "first-submission", "same-durable")
    retry = _submit_frame(session, step, run_id, "retry", "retry-submission", "same-durable")

    with _connect(harness) as (sock, reader):
        sock.sendall(first)
        _wait_until_validating(harness)
        sock.sendall(retry)
        (harness.project / "release").touch()
        answers = [json.loads(reader.readline()) for _ in range(2)]
    answers = {answer["requestId"]: answer for answer in answers}
    assert answers["first"]["outcome"] == "accepted", answers
    assert answers["retry"]["outcome"] == "adopted", answers
    assert answers["retry"]["receipt"]["submissionId"] == "first-submission"
    assert harness.query("SELECT idempotency_key, outcome FROM interactive_submissions") == [
        ("first-submission", "accepted")
    ]
    harness.wait_for_status(run_id, "completed")


@pytest.mark.integration
@pytest.mark.scenario("11.7", "3.14")
def test_one_submission_validates_at_a_time_and_a_restarted_host_finishes_it(sessions, harness):
    run_id, session, step = sessions.first_step("slow-check", SLOW_CHECK, "session-one")
    session.report_turn(step, session.new_turn_id(), "started")
    first = _submit_frame(session, step, run_id, "first", "first-submission")
    second = _submit_frame(session, step, run_id, "second", "second-submission")

    with _connect(harness) as (sock, reader):
        sock.sendall(first)
        _wait_until_validating(harness)
        sock.sendall(second)
        refused = json.loads(reader.readline())
    assert refused["requestId"] == "second" and refused["outcome"] == "conflict", refused
    assert "Another submission of this step is still being validated" in refused["error"]
    assert harness.query("SELECT status FROM interactive_requests") == [("pending",)]

    # The host stops while the first submission validates; the next host validates it.
    sessions.close()
    harness.stop()
    assert harness.query("SELECT outcome FROM interactive_submissions") == [("validating",)]
    (harness.project / "release").touch()
    harness.start_host()
    wait_until(
        lambda: harness.query("SELECT outcome FROM interactive_submissions") == [("accepted",)],
        what="the next host to accept the validating submission",
    )
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {"answer": 42}


@pytest.mark.integration
@pytest.mark.scenario("4.15")
def test_a_request_still_waiting_when_the_host_dies_fails_at_once(sessions, harness):
    run_id, session, step = sessions.first_step("slow-check", SLOW_CHECK, "session-dies")
    session.report_turn(step, session.new_turn_id(), "started")
    details = step["details"]
    interaction = next(
        i for i in session.view["pendingInteractions"] if i["requestId"] == details["requestId"]
    )
    failures: list[BaseException] = []

    def submit() -> None:
        with HostConnection(harness.home.socket_path) as connection:
            try:
                connection.request(
                    "interaction.submit",
                    {
                        **{key: details[key] for key in ("requestId", "attempt", "step")},
                        "submissionId": "doomed",
                        "value": {"answer": 42},
                    },
                    run_id=run_id,
                    expected_revision=interaction["revision"],
                )
            except HostUnavailableError as error:
                failures.append(error)

    waiting = threading.Thread(target=submit)
    waiting.start()
    _wait_until_validating(harness)
    harness.host_process.kill()
    waiting.join(timeout=30)
    assert not waiting.is_alive(), "the request kept waiting on a closed connection"
    assert [str(failure) for failure in failures] == ["The workflow host closed the connection."]
