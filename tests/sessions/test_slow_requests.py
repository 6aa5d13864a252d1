"""A slow request does not hold up the requests after it on the same connection (1.12)."""

from __future__ import annotations

import json
import socket

from pi_workflows.canonical import canonical_json
from pi_workflows.protocol.client_messages import SCHEMA

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


def test_status_is_answered_while_a_submission_on_the_same_connection_validates(sessions, harness):
    run_id, session, step = sessions.first_step("slow-check", SLOW_CHECK, "session-slow")
    session.report_turn(step, session.new_turn_id(), "started")
    details = step["details"]
    interaction = next(
        i for i in session.view["pendingInteractions"] if i["requestId"] == details["requestId"]
    )
    submit = _frame(
        "slow-submit",
        "interaction.submit",
        {
            "requestId": details["requestId"],
            "attempt": details["attempt"],
            "step": details["step"],
            "submissionId": "only",
            "value": {"answer": 42},
        },
        runId=run_id,
        expectedRevision=interaction["revision"],
    )

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(str(harness.home.socket_path))
        reader = sock.makefile("rb")
        assert json.loads(reader.readline())["type"] == "hello"
        sock.sendall(submit + _frame("quick-status", "host.status", {}))

        first = json.loads(reader.readline())  # the submission is still validating
        assert first["requestId"] == "quick-status" and first["outcome"] == "accepted"
        (harness.project / "release").touch()
        second = json.loads(reader.readline())
        assert second["requestId"] == "slow-submit" and second["outcome"] == "accepted", second
    harness.wait_for_status(run_id, "completed")
