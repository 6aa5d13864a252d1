"""A host killed after it recorded a step's interaction request but before the worker's
waiting snapshot: the resumed run asks its session once, not twice."""

from __future__ import annotations

import os
import signal

import pytest

from tests.polling import wait_until

# The worker launch goes through a relay (a real process between host and worker) that
# passes the worker protocol on, except the first message after `interaction.request`,
# which it holds: the run's request is recorded, its waiting snapshot is not.
HOLD_AFTER_REQUEST = """
import json, os, sys

from pi_workflows.plugin import WorkerProcessSpec, default_worker_process, hookimpl


@hookimpl(tryfirst=True)
def piw_worker_process(envelope, settings):
    spec = default_worker_process(envelope, settings)
    marker = os.environ["PIW_TEST_HELD"]
    if os.path.exists(marker):  # held once; later workers run as usual
        return spec
    relay = [sys.executable, "-c", RELAY, marker, *spec.argv]
    return WorkerProcessSpec(argv=relay, env=spec.env, cwd=spec.cwd, forkable=False)


RELAY = '''
import json, os, subprocess, sys, threading

marker, argv = sys.argv[1], sys.argv[2:]
worker = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def down():
    for line in sys.stdin.buffer:
        worker.stdin.write(line)
        worker.stdin.flush()
    worker.kill()


threading.Thread(target=down, daemon=True).start()
requested = False
for line in worker.stdout:
    operation = json.loads(line).get("operation")
    if requested:
        with open(marker + ".part", "w") as part:  # whole when the test sees it
            part.write(operation)
        os.replace(marker + ".part", marker)
        threading.Event().wait()  # held until the host's death ends this process group
    requested = operation == "interaction.request"
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
'''
"""


@pytest.mark.integration
def test_a_step_requested_just_before_the_host_died_is_asked_once(sessions, harness):
    held = harness.root / "held-operation"
    harness.stop()
    harness.add_plugin("hold_after_request", HOLD_AFTER_REQUEST)
    harness.start_host(PIW_TEST_HELD=str(held))
    run_id = sessions.start("two-steps", "session-k")
    wait_until(held.exists, timeout=30, what="the relay to hold the message after the request")
    assert held.read_text() == "store.writeSnapshot"
    assert len(_pending_requests(harness, run_id)) == 1

    host = harness.host_process
    os.kill(host.pid, signal.SIGKILL)
    host.wait()
    harness.start_host(PIW_TEST_HELD=str(held))

    wait_until(
        lambda: harness.client().run_status(run_id)["status"] == "waiting",
        timeout=60,
        what="the resumed run to wait for its session",
    )
    session = sessions.open("session-k")
    session.report_branch()
    step = session.deliver_next()
    assert step["details"]["step"] == "inspect"
    (pending,) = _pending_requests(harness, run_id)
    assert pending[0] == step["details"]["requestId"]
    steps = [m for m in _step_messages(harness, run_id) if m[1] != "cancelled"]
    assert steps == [(step["workflowMessageId"], "sent")]
    # The one request completes the step.
    turn = session.new_turn_id()
    session.report_turn(step, turn, "started")
    assert session.submit(step, {"findings": ["README.md"]}).outcome == "accepted"
    wait_until(
        lambda: (
            harness.query(
                "SELECT node_id FROM interactive_requests WHERE run_id = ? AND status = 'pending'",
                run_id,
            )
            == [("draft",)]
        ),
        what="the run to go on to its next step",
    )


def _pending_requests(harness, run_id):
    return harness.query(
        "SELECT request_id, attempt_id FROM interactive_requests "
        "WHERE run_id = ? AND status = 'pending'",
        run_id,
    )


def _step_messages(harness, run_id):
    return harness.query(
        "SELECT workflow_message_id, status FROM workflow_messages "
        "WHERE run_id = ? AND kind = 'step' ORDER BY order_number",
        run_id,
    )
