"""What a client makes of the host's answer to a run subscription (`view.run.watch`)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from pi_workflows import __version__
from pi_workflows.client.connection import RequestFailed
from pi_workflows.client.run_follower import follow_run
from pi_workflows.home import Home, prepare_home
from pi_workflows.protocol.client_messages import SCHEMA
from tests.host.conftest import HostHarness, harness  # noqa: F401


def _refuse_without_reason(listener: socket.socket) -> None:
    """A host that says hello, then answers the watch `rejected` with no error text.

    The client first checks the host is there (a connection it closes), then subscribes.
    """
    while True:
        conn, _ = listener.accept()
        with conn, conn.makefile("rwb") as stream:
            hello = {
                "schema": SCHEMA,
                "type": "hello",
                "connectionId": "c1",
                "pluginSet": "plugins",
                "settings": {},
            }
            stream.write(json.dumps({**hello, "packageVersion": __version__}).encode() + b"\n")
            stream.flush()
            line = stream.readline()
            if not line:
                continue
            request = json.loads(line)
            reply = {"schema": SCHEMA, "type": "response", "requestId": request["requestId"]}
            stream.write(json.dumps({**reply, "outcome": "rejected"}).encode() + b"\n")
            stream.flush()
            return


@pytest.mark.scenario("4.21")
def test_a_subscription_fails_with_the_hosts_reason_or_follows_the_run(
    harness: HostHarness,  # noqa: F811
    tmp_path: Path,
):
    harness.start_host()
    # Refused with a reason: the caller gets the host's own words.
    with pytest.raises(RequestFailed, match="Workflow run run-missing does not exist") as missing:
        follow_run(harness.home, "run-missing", lambda payload: None, autostart=False)
    assert missing.value.response.outcome == "notFound"

    # Adopted: the run is followed to its end.
    run_id = harness.start_run("hello", {"name": "watcher"})
    seen: list[dict] = []
    settled = follow_run(harness.home, run_id, seen.append, autostart=False, timeout_s=60)
    assert settled["settled"] is True and seen[-1] == settled

    # Refused with no reason: the caller is told the outcome, not left with nothing.
    home = prepare_home(Home(tmp_path / "h"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(home.socket_path))
    listener.listen(2)
    server = threading.Thread(target=_refuse_without_reason, args=(listener,), daemon=True)
    server.start()
    try:
        with pytest.raises(RequestFailed, match="^The host answered rejected.$"):
            follow_run(home, "run-any", lambda payload: None, autostart=False)
    finally:
        listener.close()
    server.join(timeout=10)
