"""The in-repo plugins survive a kill at every durable boundary: a decision delivered and
answered through the `webhook` channel, its run audited (`audit`) and its terminal message
rendered (`markdown`)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from piw_webhook.channel import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

from pi_workflows.testing import WorkflowHost
from pi_workflows.testing.crash_points import CrashCase, CrashPoints, channel_effects

SECRET = "crash-points-secret"

DECIDE = """
from pi_workflows import choice, compute, edge, human_decision, workflow

WORKFLOW = workflow(
    name="decide",
    start_at="approve",
    nodes={
        "approve": human_decision(
            audience="operator",
            choices={"ship": choice("Ship"), "stop": choice("Stop")},
            request=lambda ctx: {"title": "Ship it?", "subject": ctx.input,
                                 "presentation": {"summary": "ready", "blocks": []}},
        ),
        "done": compute(lambda ctx: {"answer": ctx.outputs["approve"]["choice"]}),
    },
    edges=[edge("approve", "done")],
)
"""


class Deliveries:
    """The webhook's receiver: keeps each decision request's latest answer URL."""

    def __init__(self) -> None:
        self.answer_urls: dict[str, str] = {}
        self.received: set[tuple[str, str]] = set()  # (decision id, "delivery"|"settlement")
        answer_urls, received = self.answer_urls, self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body["type"] == "decision.request":
                    answer_urls[body["request"]["decisionId"]] = body["answerUrl"]
                    received.add((body["request"]["decisionId"], "delivery"))
                else:
                    received.add((body["decisionId"], "settlement"))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


# Host kills at every boundary cost a few minutes: with --crash-points=full only.
TARGETS = {False: ("worker",), True: ("worker", "host")}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def deliveries() -> Iterator[Deliveries]:
    receiver = Deliveries()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def plugins_case(deliveries: Deliveries) -> CrashCase:
    def prepare(host: WorkflowHost) -> None:
        host.use_entry_points("audit", "markdown", "webhook")
        host.write_workflow("decide", DECIDE)
        secret = host.config_dir / "hook.secret"
        secret.write_text(SECRET + "\n")
        channels = host.config_dir / "channels.json"
        channels.write_text(
            json.dumps(
                {
                    "audiences": {"operator": ["cli", "hook"]},
                    "channels": {
                        "hook": {
                            "kind": "webhook",
                            "url": deliveries.url,
                            "secret_file": str(secret),
                            "allowed_actors": ["alice"],
                            # A fixed port: a request delivered before a host died stays
                            # answerable at its URL once the next host listens again.
                            "listen_port": _free_port(),
                        }
                    },
                }
            )
        )
        for path in (secret, channels):
            os.chmod(path, 0o600)

    def answer(host: WorkflowHost, run: dict[str, Any]) -> None:
        client = host.client()
        try:
            pending = [d for d in client.list_decisions() if d["runId"] == run["runId"]]
        finally:
            client.close()
        for decision in pending:
            url = deliveries.answer_urls.get(decision["decisionId"])
            if url is None:
                continue  # not delivered yet: the next pass looks again
            answer = {"decisionId": decision["decisionId"], "choice": "ship", "actor": "alice"}
            body = json.dumps({**answer, "nonce": uuid.uuid4().hex}).encode()
            stamp = str(int(time.time()))
            headers = {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: sign(SECRET, stamp, body)}
            request = urllib.request.Request(url, data=body, method="POST", headers=headers)
            with urllib.request.urlopen(request, timeout=10):
                pass  # a late answer (409) raises: the explorer looks again

    def resolve(host: WorkflowHost) -> None:
        """An operator who can see the receiver: a channel effect a dead host left in doubt
        happened if the receiver got it (the cli channel's own always did)."""
        client = host.client()
        try:
            for effect in client.list_effects(status="ambiguous"):
                if effect["scope"] != "channel":
                    continue
                kind = effect["effectType"].rsplit(".", 1)[1]
                if (
                    effect["channel"] == "cli"
                    or (effect["decisionId"], kind) in deliveries.received
                ):
                    client.confirm_effect(effect["effectId"])
                else:
                    client.retry_effect(effect["effectId"])
        finally:
            client.close()

    return CrashCase(
        "decide",
        {"plan": "1.2.3"},
        prepare=prepare,
        answer=answer,
        resolve=resolve,
        effects=channel_effects,
    )


@pytest.mark.integration
def test_the_in_repo_plugins_survive_a_kill_at_every_boundary(
    crash_points: CrashPoints, deliveries: Deliveries
) -> None:
    report = crash_points.explore(plugins_case(deliveries), targets=TARGETS[crash_points.full])

    print(report.summary())
    assert report.boundaries and report.kills
    report.assert_clean()
