"""pi-workflows-webhook with the test kit: a real host delivers to a real HTTP receiver."""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from piw_webhook.channel import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookChannel, sign

from pi_workflows.plugin import ChannelConfigError
from pi_workflows.testing import (
    CrashCase,
    CrashPoints,
    WorkflowHost,
    channel_context,
    channel_effects,
    wait_until,
)

SECRET = "test-webhook-secret"

DECIDE = """
from pi_workflows import choice, compute, edge, human_decision, workflow

WORKFLOW = workflow(
    name="decide",
    start_at="approve",
    nodes={
        "approve": human_decision(
            audience="operator",
            choices={"ship": choice("Ship"), "stop": choice("Stop")},
            request=lambda ctx: {
                "title": "Ship it?",
                "subject": {"secret-plan": ctx.input},
                "presentation": {"summary": "Release 1.2.3 is ready.", "blocks": []},
            },
        ),
        "done": compute(lambda ctx: {"answer": ctx.outputs["approve"]}),
    },
    edges=[edge("approve", "done")],
)
"""


class Receiver:
    """The receiving side of the webhook: a stdlib HTTP server that keeps what it got and
    answers `status` (204, or an error to make the channel fail)."""

    def __init__(self) -> None:
        self.status = 204
        receiver = self
        self.received: queue.Queue[tuple[dict[str, Any], bytes, dict[str, str]]] = queue.Queue()
        # Every decision request's latest answer URL, and each (decision id, type) that came.
        self.answer_urls: dict[str, str] = {}
        self.seen: set[tuple[str, str]] = set()
        received, answer_urls, seen = self.received, self.answer_urls, self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                parsed = json.loads(body)
                received.put((parsed, body, dict(self.headers)))
                if parsed["type"] == "decision.request":
                    answer_urls[parsed["request"]["decisionId"]] = parsed["answerUrl"]
                    seen.add((parsed["request"]["decisionId"], "delivery"))
                else:
                    seen.add((parsed["decisionId"], "settlement"))
                self.send_response(receiver.status)
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


def _signed(answer: dict[str, Any], secret: str = SECRET, stamp: int | None = None):
    body = json.dumps(answer).encode()
    timestamp = str(int(time.time()) if stamp is None else stamp)
    return body, {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: sign(secret, timestamp, body)}


def _send(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _configure(host: WorkflowHost, url: str, listen_port: int = 0, **policy: int) -> None:
    secret_file = host.config_dir / "hook.secret"
    secret_file.write_text(SECRET + "\n")
    channels = host.config_dir / "channels.json"
    channels.write_text(
        json.dumps(
            {
                "audiences": {"operator": ["cli", "hook"]},
                "channels": {
                    "hook": {
                        "kind": "webhook",
                        "url": url,
                        "secret_file": str(secret_file),
                        "allowed_actors": ["alice"],
                        "listen_port": listen_port,
                        **policy,
                    }
                },
            }
        )
    )
    for path in (secret_file, channels):
        os.chmod(path, 0o600)


@pytest.mark.scenario("10.16", "10.19")
def test_a_host_delivers_signed_requests_and_accepts_one_signed_answer(
    workflow_host: WorkflowHost, receiver: Receiver
):
    workflow_host.use_entry_points("webhook")
    _configure(workflow_host, receiver.url)
    workflow_host.write_workflow("decide", DECIDE)
    workflow_host.start()
    run_id = workflow_host.start_run("decide", {"plan": "release"})

    delivered, raw, headers = receiver.next("decision.request")
    assert headers[SIGNATURE_HEADER] == sign(SECRET, headers[TIMESTAMP_HEADER], raw)
    assert delivered["request"]["runId"] == run_id
    assert "subject" not in delivered["request"] and b"secret-plan" not in raw
    assert SECRET not in workflow_host.host_log()
    answer_url = delivered["answerUrl"]
    workflow_host.wait_for_status(run_id, "waiting")  # parked: an answer continues it at once
    answer = {"decisionId": delivered["request"]["decisionId"], "choice": "ship"}

    forged = _send(answer_url, *_signed({**answer, "actor": "alice", "nonce": "1"}, "wrong"))
    stale = _send(answer_url, *_signed({**answer, "actor": "alice", "nonce": "2"}, stamp=1))
    mallory = _send(answer_url, *_signed({**answer, "actor": "mallory", "nonce": "3"}))
    body, signed = _signed({**answer, "actor": "alice", "nonce": uuid.uuid4().hex})
    status, result = _send(answer_url, body, signed)
    replayed = _send(answer_url, body, signed)

    assert (forged[0], stale[0], mallory[0]) == (401, 401, 403)
    assert status == 200 and result["outcome"] == "accepted"
    assert replayed[0] == 409
    child = result["receipt"]["continuationRunId"]
    final = workflow_host.wait_for_run(child)
    assert final["status"] == "completed"
    assert final["finalOutput"]["answer"]["choice"] == "ship"
    settled, _, _ = receiver.next("decision.settled")
    assert settled["resolution"]["response"] == {"choice": "ship"}


def test_answers_reach_report_answer_once_and_only_from_allowed_actors():
    context = channel_context(
        "hook",
        kind="webhook",
        options={"url": "http://127.0.0.1:9/unused"},
        credentials={"secret": SECRET},
        allowed_actors=("alice",),
    )
    channel = WebhookChannel(context)
    try:
        body, headers = _signed(
            {"decisionId": "d-1", "choice": "ship", "actor": "alice", "nonce": "n"}
        )
        accepted = channel.handle_answer(headers, body)
        replayed = channel.handle_answer(headers, body)
        body, headers = _signed({"decisionId": "d-1", "choice": "x", "actor": "eve", "nonce": "m"})
        refused = channel.handle_answer(headers, body)
    finally:
        channel.close()

    assert accepted[0] == 200 and replayed[0] == 409 and refused[0] == 403
    assert context.report_answer.answers == [("d-1", "ship", None, "alice")]


def test_a_channel_without_its_secret_refuses_to_start():
    with pytest.raises(ChannelConfigError, match="needs 'secret_file'"):
        WebhookChannel(channel_context("hook", options={"url": "http://127.0.0.1:9/"}))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def crash_case(receiver: Receiver) -> CrashCase:
    """The built-in human-decision example, its decision delivered and answered through the
    webhook, its run audited and its terminal message rendered by the other plugins."""

    def prepare(host: WorkflowHost) -> None:
        host.use_entry_points("audit", "markdown", "webhook")
        # A fixed answer port: a request delivered before a host died stays answerable at
        # its URL once the next host listens again.
        _configure(host, receiver.url, listen_port=_free_port())

    def answer(host: WorkflowHost, run: dict[str, Any]) -> None:
        client = host.client()
        try:
            pending = [d for d in client.list_decisions() if d["runId"] == run["runId"]]
        finally:
            client.close()
        for decision in pending:
            url = receiver.answer_urls.get(decision["decisionId"])
            if url is None:
                continue  # not delivered yet: the next pass looks again
            answer = {"decisionId": decision["decisionId"], "choice": "continue", "actor": "alice"}
            _send(url, *_signed({**answer, "nonce": uuid.uuid4().hex}))

    def resolve(host: WorkflowHost) -> None:
        """An operator who can see the receiver: a channel effect a dead host left in doubt
        happened if the receiver got it (the cli channel's own always did)."""
        client = host.client()
        try:
            for effect in client.list_effects(status="ambiguous"):
                if effect["scope"] != "channel":
                    continue
                kind = effect["effectType"].rsplit(".", 1)[1]
                if effect["channel"] == "cli" or (effect["decisionId"], kind) in receiver.seen:
                    client.confirm_effect(effect["effectId"])
                else:
                    client.retry_effect(effect["effectId"])
        finally:
            client.close()

    return CrashCase(
        "human-decision",
        {"goal": "ship 1.2.3"},
        prepare=prepare,
        answer=answer,
        resolve=resolve,
        effects=channel_effects,
    )


@pytest.mark.integration
def test_the_plugins_survive_a_kill_at_every_durable_boundary(
    crash_points: CrashPoints, receiver: Receiver
) -> None:
    # Host kills at every boundary cost minutes: with --crash-points=full only.
    targets = ("worker", "host") if crash_points.full else ("worker",)

    report = crash_points.explore(crash_case(receiver), targets=targets)

    print(report.summary())
    assert report.boundaries and report.kills
    report.assert_clean()


# Records what the host announces of a channel that gave up.
GAVE_UP_RECORDER = """
import json
import os

from piw_webhook.channel import WebhookChannel

from pi_workflows.plugin import hookimpl


@hookimpl
def piw_channel_gave_up(gave_up):
    entry = {
        "channel": gave_up.channel_name,
        "kind": gave_up.channel_kind,
        "purpose": gave_up.purpose,
        "effectId": gave_up.effect_id,
        "attempts": gave_up.attempts,
        "error": gave_up.error,
        "at": gave_up.at,
        "decisionId": gave_up.request["decisionId"],
        "runId": gave_up.request["runId"],
        "request": sorted(gave_up.request),
        "isWebhook": isinstance(gave_up.channel, WebhookChannel),
    }
    with open(os.environ["PIW_TEST_RECORD"], "a") as handle:
        handle.write(json.dumps(entry) + "\\n")
"""


@pytest.mark.hook_effect("piw_channel_gave_up")
def test_a_plugin_hears_when_the_webhook_delivery_gives_up_and_again_after_a_retry(
    workflow_host: WorkflowHost, receiver: Receiver
):
    record = workflow_host.root / "gave-up.jsonl"
    workflow_host.use_entry_points("webhook")
    workflow_host.add_plugin("gave_up_recorder", GAVE_UP_RECORDER)
    receiver.status = 503  # the receiver is up and refuses every request
    _configure(workflow_host, receiver.url, delivery_attempts=2, retry_delay_ms=50)
    workflow_host.write_workflow("decide", DECIDE)
    workflow_host.start(PIW_TEST_RECORD=str(record))
    run_id = workflow_host.start_run("decide", {"plan": "release"})

    def heard() -> list[dict[str, Any]]:
        return [json.loads(line) for line in record.read_text().splitlines()]

    (gave_up,) = wait_until(
        lambda: record.exists() and heard(), timeout=30, what="the plugin to hear it gave up"
    )
    attempts = [receiver.next("decision.request") for _ in range(2)]
    assert {body["request"]["runId"] for body, _, _ in attempts} == {run_id}
    assert gave_up["channel"] == "hook" and gave_up["kind"] == "webhook"
    assert (gave_up["purpose"], gave_up["attempts"]) == ("delivery", 2)
    assert gave_up["error"] == "webhook answered HTTP 503"
    assert gave_up["runId"] == run_id and gave_up["isWebhook"] is True
    assert "subject" not in gave_up["request"]  # the private subject never reaches plugins
    assert gave_up["at"] > 0
    # The effect it names is the one the operator sees given up (the `cli` channel of
    # the audience has its own, applied).
    client = workflow_host.client()
    try:
        effects = {e["effectId"]: e for e in client.list_effects() if e["scope"] == "channel"}
    finally:
        client.close()
    given_up = effects[gave_up["effectId"]]
    assert (given_up["status"], given_up["gaveUp"], given_up["attempts"]) == ("rejected", True, 2)

    # An operator's retry is one more attempt: it fails too, and is announced again.
    workflow_host.cli("effects", "retry", gave_up["effectId"])
    wait_until(lambda: len(heard()) == 2, timeout=30, what="the retry to give up again")
    assert heard()[1]["attempts"] == 3
    assert receiver.next("decision.request")[0]["request"]["decisionId"] == gave_up["decisionId"]
    assert SECRET not in workflow_host.host_log()
