"""A client whose connection drops mid-request retries once with the same identity, so
the host adopts a command it already applied instead of applying it twice (4.13/4.14)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from pi_workflows import __version__
from pi_workflows.client import WorkflowClient
from pi_workflows.home import Home, prepare_home
from pi_workflows.protocol.client_messages import SCHEMA


def _serve(listener: socket.socket, seen: list[dict]) -> None:
    """Drop the first connection after reading its request; answer the second."""
    for attempt in range(2):
        conn, _ = listener.accept()
        with conn, conn.makefile("rwb") as stream:
            hello = {
                "schema": SCHEMA,
                "type": "hello",
                "connectionId": f"c{attempt}",
                "pluginSet": "plugins",
                "settings": {},
            }
            stream.write(json.dumps({**hello, "packageVersion": __version__}).encode() + b"\n")
            stream.flush()
            request = json.loads(stream.readline())
            seen.append(request)
            if attempt == 0:
                continue  # the host "died" after the request arrived
            reply = {"schema": SCHEMA, "type": "response", "requestId": request["requestId"]}
            reply.update(outcome="adopted", receipt={"runId": "r-1", "status": "queued"})
            stream.write(json.dumps(reply).encode() + b"\n")
            stream.flush()


@pytest.mark.scenario("4.13")
def test_a_dropped_request_is_retried_with_the_same_identity(tmp_path: Path):
    home = prepare_home(Home(tmp_path / "h"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(home.socket_path))
    listener.listen(2)
    seen: list[dict] = []
    server = threading.Thread(target=_serve, args=(listener, seen), daemon=True)
    server.start()
    client = WorkflowClient(home, autostart=False)
    try:
        receipt = client.call("run.cancel", {}, run_id="r-1")
    finally:
        client.close()
        listener.close()
    server.join(timeout=10)
    assert receipt == {"runId": "r-1", "status": "queued"}
    first, second = seen
    for key in ("requestId", "clientId", "idempotencyKey", "payload", "runId"):
        assert first[key] == second[key], key
