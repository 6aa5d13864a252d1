"""What the Python client makes of a host that breaks the protocol, of a run the host does
not know, and of calls after `close()` (issue 22.8; reference 4.4, 4.6, 4.16, 4.22).

The host is a real Unix socket server in a private home, played by a thread that
answers every request with what the test scripted.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pi_workflows import __version__
from pi_workflows.client import WorkflowClient
from pi_workflows.client.connection import RequestFailed
from pi_workflows.errors import ClientClosedError, HostProtocolError
from pi_workflows.home import Home, prepare_home
from pi_workflows.protocol.client_messages import SCHEMA
from pi_workflows.testing import WorkflowHome, short_temp_dir

HELLO = {
    "schema": SCHEMA,
    "type": "hello",
    "connectionId": "connection-1",
    "packageVersion": __version__,
    "pluginSet": "plugins",
    "settings": {},
}
RUN_VIEW = {
    "runId": "run-1",
    "workflowName": "hello",
    "status": "completed",
    "queueStatus": "completed",
    "paused": False,
    "revision": 3,
}

# request -> the lines the host sends back
Answer = Callable[[dict], list[bytes]]


def _response(request: dict, **fields: object) -> bytes:
    message = {"schema": SCHEMA, "type": "response", "requestId": request["requestId"]}
    return json.dumps({**message, **fields}).encode() + b"\n"


class ScriptedHost:
    """A socket server that says `hello`, then answers each request with `answer`."""

    def __init__(self, home: Home) -> None:
        self.hello: dict = HELLO
        self.answer: Answer = lambda request: [_response(request, outcome="accepted")]
        self.connections = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(home.socket_path))
        self._listener.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            try:
                stream.write(json.dumps(self.hello).encode() + b"\n")
                stream.flush()
                for line in stream:
                    for reply in self.answer(json.loads(line)):
                        stream.write(reply)
                    stream.flush()
            except OSError:
                return

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the thread
        self._listener.close()
        self._thread.join(timeout=10)


@pytest.fixture
def home() -> Iterator[WorkflowHome]:
    workflow_home = WorkflowHome(short_temp_dir())
    prepare_home(workflow_home.home)
    try:
        yield workflow_home
    finally:
        workflow_home.cleanup()


@pytest.fixture
def host(home: WorkflowHome) -> Iterator[ScriptedHost]:
    scripted = ScriptedHost(home.home)
    try:
        yield scripted
    finally:
        scripted.close()


def _client(home: WorkflowHome) -> WorkflowClient:
    return WorkflowClient(home.home, autostart=False)


@pytest.mark.scenario("4.4", "4.6")
@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (lambda r: [b"{not json\n"], "not JSON"),
        (lambda r: [json.dumps([1]).encode() + b"\n"], "must be a JSON object"),
        (lambda r: [_response(r, outcome="accepted", schema="v0")], "Expected a pi-workflows"),
        (lambda r: [json.dumps({**r, "payload": {}}).encode() + b"\n"], "not 'request'"),
        (lambda r: [_response(r, outcome="maybe")], "Unknown response outcome 'maybe'"),
        (lambda r: [_response(r, outcome="accepted", extra=1)], "Unknown client protocol field"),
        (lambda r: [_response(r)], "The response is missing outcome"),
        (lambda r: [_response(r, outcome="accepted", revision=1.5)], "revision must be"),
        (lambda r: [_response(r, outcome="rejected", error="")], "error must be non-empty"),
        (lambda r: [_response(r, outcome="accepted", requestId="")], "requestId must be"),
        (
            lambda r: [
                json.dumps(
                    {"schema": SCHEMA, "type": "event", "subscriptionId": "s", "event": "x"}
                ).encode()
                + b"\n"
            ],
            "The event is missing payload",
        ),
        (lambda r: [json.dumps(HELLO).encode() + b"\n"], "Unexpected hello after the hello"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "another-schema",
        "a-request",
        "unknown-outcome",
        "extra-key",
        "no-outcome",
        "fractional-revision",
        "empty-error",
        "empty-request-id",
        "event-without-payload",
        "second-hello",
    ],
)
def test_a_malformed_host_message_is_a_protocol_error(
    home: WorkflowHome, host: ScriptedHost, reply: Answer, says: str
):
    host.answer = reply
    client = _client(home)
    try:
        with pytest.raises(HostProtocolError, match="malformed message") as refused:
            client.host_status()
        assert says in str(refused.value)
        assert "\n" not in str(refused.value)
        # The broken connection is dropped: the next call starts on a new one.
        host.answer = lambda request: [_response(request, outcome="accepted", receipt={})]
        assert client.host_status() == {}
        assert host.connections == 2
    finally:
        client.close()


@pytest.mark.scenario("4.6")
def test_a_hello_with_an_empty_connection_id_is_refused(home: WorkflowHome, host: ScriptedHost):
    host.hello = {**HELLO, "connectionId": ""}
    client = _client(home)
    with pytest.raises(HostProtocolError, match="The hello's connectionId must be non-empty"):
        client.host_status()


@pytest.mark.scenario("4.22")
def test_run_reads_are_checked_and_an_unknown_run_is_none(home: WorkflowHome, host: ScriptedHost):
    client = _client(home)
    try:
        host.answer = lambda r: [_response(r, outcome="accepted", receipt={})]
        with pytest.raises(HostProtocolError, match="invalid run view for run-1: no runId"):
            client.run_status("run-1")
        host.answer = lambda r: [_response(r, outcome="accepted", receipt=RUN_VIEW)]
        with pytest.raises(HostProtocolError, match="the view is of run run-1"):
            client.run_status("run-2")
        assert client.run_status("run-1") == RUN_VIEW
        host.answer = lambda r: [_response(r, outcome="rejected")]
        with pytest.raises(HostProtocolError, match="invalid run view"):
            client.run_status("run-1")
        host.answer = lambda r: [_response(r, outcome="rejected", error="exact run failed")]
        with pytest.raises(RequestFailed, match="^exact run failed$"):
            client.run_status("run-1")
        host.answer = lambda r: [_response(r, outcome="notFound", error="Workflow run nope")]
        assert client.run_status("nope") is None
        host.answer = lambda r: [_response(r, outcome="accepted", receipt=[RUN_VIEW, {}])]
        with pytest.raises(HostProtocolError, match="invalid run view for a run"):
            client.list_runs()
    finally:
        client.close()


@pytest.mark.scenario("4.16")
def test_a_closed_client_refuses_calls_without_reconnecting(home: WorkflowHome, host: ScriptedHost):
    host.answer = lambda r: [_response(r, outcome="accepted", receipt={"ok": True})]
    client = _client(home)
    assert client.host_status() == {"ok": True}
    client.close()
    client.close()  # closing twice is allowed
    for call in (client.host_status, lambda: client.run_status("run-1"), client.list_runs):
        with pytest.raises(ClientClosedError, match="Workflow client is closed"):
            call()
    assert host.connections == 1


def test_the_cli_reports_a_malformed_answer_in_one_line(home: WorkflowHome, host: ScriptedHost):
    # The CLI's own plugin set, so that it has nothing to warn about.
    host.hello = {**HELLO, "pluginSet": _cli_plugin_set(home)}
    host.answer = lambda r: [_response(r, outcome="accepted", receipt={"runId": "run-1"})]
    result = _cli(home, "run", "status", "run-1")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "invalid run view for run-1: no workflowName" in result.stderr
    host.answer = lambda r: [_response(r, outcome="notFound", error="Workflow run nope")]
    missing = _cli(home, "run", "status", "nope")
    assert missing.returncode == 1
    assert missing.stderr == (
        "Error: Workflow run nope does not exist; see 'pi-workflows run list'.\n"
    )


def _cli(home: WorkflowHome, *args: str) -> subprocess.CompletedProcess[str]:
    console = str(Path(sys.executable).with_name("pi-workflows"))
    return subprocess.run(
        [console, "--no-autostart", *args],
        env=home.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _cli_plugin_set(home: WorkflowHome) -> str:
    digest = "from pi_workflows.plugin_set import plugin_set_digest; print(plugin_set_digest())"
    found = subprocess.run(
        [sys.executable, "-c", digest],
        env=home.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return found.stdout.strip()


@pytest.mark.scenario("4.16")
def test_against_a_real_host_an_unknown_run_is_none_and_a_closed_client_refuses(
    in_process_host,
):
    in_process_host.start()
    run_id = in_process_host.start_run("hello", {"name": "Ada"})
    client = in_process_host.client()
    try:
        assert client.run_status("no-such-run") is None
        assert client.known_run_status(run_id)["runId"] == run_id
    finally:
        client.close()
    with pytest.raises(ClientClosedError, match="Workflow client is closed"):
        client.run_status(run_id)
