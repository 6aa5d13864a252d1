"""Decision channels: a real webhook receiver, signed answers, and a channel that hangs."""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .conftest import HostHarness, decision_workflow, pending_decision, wait_until, write_channels

SECRET = "test-webhook-secret"


class Receiver:
    """The receiving side of the webhook: a stdlib HTTP server that keeps what it got."""

    def __init__(self) -> None:
        self.received: queue.Queue[tuple[dict[str, Any], bytes, dict[str, str]]] = queue.Queue()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.put((json.loads(body), body, dict(self.headers)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def next(self, kind: str) -> tuple[dict[str, Any], bytes, dict[str, str]]:
        deadline = time.monotonic() + 30
        while True:
            body, raw, headers = self.received.get(timeout=max(0.1, deadline - time.monotonic()))
            if body["type"] == kind:
                return body, raw, headers


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def _post_answer(url: str, answer: dict[str, Any], secret: str, timestamp: int | None = None):
    from piw_webhook.channel import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

    body = json.dumps(answer).encode()
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    return _send(url, body, {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: sign(secret, stamp, body)})


def _send(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_webhook_delivers_signed_requests_and_rejects_forged_and_replayed_answers(
    harness: HostHarness, receiver: Receiver, webhook_plugin: str
):
    from piw_webhook.channel import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

    secret_file = harness.config / "hook.secret"
    secret_file.write_text(SECRET + "\n")
    os.chmod(secret_file, 0o600)
    write_channels(
        harness,
        {
            "audiences": {"operator": ["cli", "hook"]},
            "channels": {
                "hook": {
                    "kind": "webhook",
                    "url": receiver.url,
                    "secret_file": str(secret_file),
                    "allowed_actors": ["alice"],
                }
            },
        },
    )
    harness.write_workflow("decide", decision_workflow(60_000))
    harness.start_host()
    run_id = harness.start_run("decide")
    decision_id = pending_decision(harness, run_id)["decisionId"]

    delivered, raw, headers = receiver.next("decision.request")
    assert headers[SIGNATURE_HEADER] == sign(SECRET, headers[TIMESTAMP_HEADER], raw)
    assert delivered["request"]["decisionId"] == decision_id
    assert "subject" not in delivered["request"] and b"secret-plan" not in raw
    assert SECRET not in harness.host_log()
    answer_url = delivered["answerUrl"]
    assert answer_url.startswith("http://127.0.0.1:")

    answer = {"decisionId": decision_id, "choice": "ship", "actor": "alice"}
    forged = _post_answer(answer_url, {**answer, "nonce": "n-1"}, "not-the-secret")
    assert forged[0] == 401
    stale = _post_answer(answer_url, {**answer, "nonce": "n-2"}, SECRET, int(time.time()) - 3600)
    assert stale[0] == 401
    mallory = _post_answer(answer_url, {**answer, "actor": "mallory", "nonce": "n-3"}, SECRET)
    assert mallory[0] == 403
    assert pending_decision(harness, run_id)["status"] == "pending"

    body = json.dumps({**answer, "nonce": uuid.uuid4().hex}).encode()
    stamp = str(int(time.time()))
    signed = {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: sign(SECRET, stamp, body)}
    status, result = _send(answer_url, body, signed)
    assert status == 200 and result["outcome"] == "accepted"
    assert _send(answer_url, body, signed)[0] == 409  # the same signed bytes, replayed

    child = result["receipt"]["continuationRunId"]
    assert harness.wait_for_status(child, "completed")["finalOutput"]["route"] == "ship"
    settled, _, _ = receiver.next("decision.settled")
    assert settled["decisionId"] == decision_id
    assert settled["resolution"]["response"] == {"choice": "ship"}
    winner = harness.query(
        "SELECT provenance, channel, actor FROM human_decision_resolutions WHERE decision_id = ?",
        decision_id,
    )
    assert winner == [("human", "hook", "alice")]
    effects = harness.query(
        "SELECT effect_type, status, attempt_count FROM effects WHERE scope = 'channel' "
        "AND idempotency_key = ? ORDER BY effect_type",
        f"{decision_id}|hook",
    )
    assert effects == [("channel.delivery", "applied", 1), ("channel.settlement", "applied", 1)]


STUCK_CHANNEL = """
import time
from pathlib import Path

from pi_workflows.hookspecs import hookimpl


class StuckChannel:
    def __init__(self, context):
        self.started = Path(context.options["started"])
        self.release = Path(context.options["release"])

    def deliver(self, request):
        self.started.write_text("delivering")
        deadline = time.monotonic() + 60
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"stuck": False}

    def settle(self, request, resolution, delivery):
        return {}

    def close(self):
        return None


@hookimpl
def piw_register_decision_channels(register):
    register("stuck", StuckChannel)
"""


def test_a_hanging_channel_does_not_slow_the_host(harness: HostHarness, tmp_path: Path):
    (tmp_path / "stuck_channel.py").write_text(STUCK_CHANNEL)
    started, release = harness.root / "started", harness.root / "release"
    write_channels(
        harness,
        {
            "audiences": {"operator": ["cli", "stuck"]},
            "channels": {
                "stuck": {"kind": "stuck", "started": str(started), "release": str(release)}
            },
        },
    )
    harness.write_workflow("decide", decision_workflow(None))
    harness.start_host(
        PI_WORKFLOWS_PLUGINS="stuck_channel",
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    run_id = harness.start_run("decide")
    wait_until(started.exists, what="the stuck channel's delivery to begin")

    client = harness.client()
    round_trips = []
    for _ in range(20):
        began = time.perf_counter()
        client.run_status(run_id)
        round_trips.append(time.perf_counter() - began)
    assert max(round_trips) < 0.5, round_trips
    decision_id = pending_decision(harness, run_id)["decisionId"]
    began = time.perf_counter()
    assert client.answer_decision(decision_id, "ship").outcome == "accepted"
    assert time.perf_counter() - began < 1.0
    client.close()

    release.touch()
    wait_until(
        lambda: (
            harness.query(
                "SELECT status FROM effects WHERE effect_type = 'channel.settlement' "
                "AND idempotency_key = ?",
                f"{decision_id}|stuck",
            )
            == [("applied",)]
        ),
        what="the stuck channel to deliver and settle once released",
    )


CLOSING_CHANNEL = """
from pathlib import Path

from pi_workflows.hookspecs import hookimpl


class ClosingChannel:
    def __init__(self, context):
        self.closed = Path(context.options["closed"])

    def deliver(self, request):
        return {"delivered": True}

    def settle(self, request, resolution, delivery):
        return {}

    def close(self):
        self.closed.write_text("closed")


@hookimpl
def piw_register_decision_channels(register):
    register("closing", ClosingChannel)
"""


def test_a_stopping_host_closes_its_channels(harness: HostHarness, tmp_path: Path):
    (tmp_path / "closing_channel.py").write_text(CLOSING_CHANNEL)
    closed = harness.root / "closed"
    write_channels(harness, {"channels": {"closer": {"kind": "closing", "closed": str(closed)}}})
    harness.start_host(
        PI_WORKFLOWS_PLUGINS="closing_channel",
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    assert not closed.exists()
    harness.cli("host", "stop")
    wait_until(closed.exists, what="the channel's close() during host stop")
