"""A Unix-socket relay between the Pi extension and the host that can lose or hold frames.

The acknowledgement of a report that the host did commit can only be lost on the wire, and
a reply can only be late there; this relay is that wire. It forwards newline-delimited
frames unchanged and logs every request (`requests`) and pushed event (`events`). Rules,
each used once, in order:

- `lose_reply(match)`: forward the first matching request, then drop its response and cut
  the connection (the host committed; the client never learns it);
- `hold_request(match)` / `hold_reply(match)`: keep the first matching request (or its
  response) until the returned event is set;
- `rewrite_reply(match, rewrite)`: send `rewrite(response)` instead of the response to the
  first matching request; `rewrite_event(match, rewrite)`: the same for the first event
  frame that matches (a host that answers wrongly).

`cli_shim(path)` writes a `PI_WORKFLOWS_CLI` that names the relay as the host's socket and
passes every other command to the real CLI.
"""

from __future__ import annotations

import contextlib
import json
import socket
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pi_workflows import __version__

Match = Callable[[dict[str, Any]], bool]


@dataclass
class _Rule:
    kind: str  # "lose_reply" | "hold_request" | "hold_reply" | "rewrite_reply" | "rewrite_event"
    match: Match
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    release: threading.Event = field(default_factory=threading.Event)
    used: bool = False


class Relay:
    def __init__(self, path: Path, host_socket: Path) -> None:
        self.path = path
        self.host_socket = host_socket
        self.requests: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.cli = ""  # set by the fixture: the PI_WORKFLOWS_CLI that leads here
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def lose_reply(self, match: Match) -> None:
        self._rules.append(_Rule("lose_reply", match))

    def hold_request(self, match: Match) -> threading.Event:
        rule = _Rule("hold_request", match)
        self._rules.append(rule)
        return rule.release

    def hold_reply(self, match: Match) -> threading.Event:
        rule = _Rule("hold_reply", match)
        self._rules.append(rule)
        return rule.release

    def rewrite_reply(self, match: Match, rewrite: Callable[[dict], dict]) -> None:
        self._rules.append(_Rule("rewrite_reply", match, rewrite=rewrite))

    def rewrite_event(self, match: Match, rewrite: Callable[[dict], dict]) -> None:
        self._rules.append(_Rule("rewrite_event", match, rewrite=rewrite))

    def requests_for(self, operation: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["operation"] == operation]

    def close(self) -> None:
        for rule in self._rules:
            rule.release.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    # --- relaying ---------------------------------------------------------------------------

    def _claim(self, kind: str, request: dict[str, Any]) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.kind == kind and not rule.used and rule.match(request):
                    rule.used = True
                    return rule
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            host.connect(str(self.host_socket))
            self._sockets += [client, host]
            replies: dict[str, _Rule] = {}
            threading.Thread(
                target=self._upstream, args=(client, host, replies), daemon=True
            ).start()
            threading.Thread(
                target=self._downstream, args=(client, host, replies), daemon=True
            ).start()

    def _upstream(self, client: socket.socket, host: socket.socket, replies: dict) -> None:
        for line in _lines(client):
            request = json.loads(line)
            with self._lock:
                self.requests.append(request)
            held = self._claim("hold_request", request)
            if held is not None:
                held.release.wait()
            for kind in ("lose_reply", "hold_reply", "rewrite_reply"):
                rule = self._claim(kind, request)
                if rule is not None:
                    replies[request["requestId"]] = rule
            try:
                host.sendall(line + b"\n")
            except OSError:
                return
        _cut(client, host)

    def _downstream(self, client: socket.socket, host: socket.socket, replies: dict) -> None:
        for line in _lines(host):
            frame = json.loads(line)
            if frame.get("type") == "event":
                with self._lock:
                    self.events.append(frame)
            rule = (
                replies.pop(frame.get("requestId"), None)
                if frame.get("type") == "response"
                else None
            )
            if frame.get("type") == "event":
                rule = self._claim("rewrite_event", frame)
            if rule is not None and rule.kind == "lose_reply":
                _cut(client, host)
                return
            if rule is not None and rule.rewrite is not None:
                line = json.dumps(rule.rewrite(frame)).encode()
            elif rule is not None:
                rule.release.wait()
            try:
                client.sendall(line + b"\n")
            except OSError:
                return
        _cut(client, host)


def _lines(sock: socket.socket):
    buffer = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line:
                yield line


def _cut(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def cli_shim(path: Path, relay: Relay) -> Path:
    """A CLI for the extension whose host socket is the relay; the rest is the real CLI."""
    address = {"socketPath": str(relay.path), "packageVersion": __version__}
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = pi ] && [ "$2" = socket ]; then\n'
        f"  printf '%s\\n' '{json.dumps(address)}'\n"
        "  exit 0\n"
        "fi\n"
        f'exec {sys.executable} -m pi_workflows "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path
