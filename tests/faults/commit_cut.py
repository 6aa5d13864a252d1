"""A TCP proxy in front of a PostgreSQL server that cuts a connection at its COMMIT.

The host connects through the proxy; the test arms it with a piece of SQL. The first
transaction that runs a statement containing it has its connection cut exactly at the
COMMIT, one of two ways:

- ``after``: the COMMIT reaches the server, which commits; its answer is thrown away and
  both sides are closed. The change is durable, but the host only sees its connection die.
- ``before``: the COMMIT is never sent; both sides are closed, so the server rolls the
  transaction back. The host sees exactly the same thing.

Either way the host cannot know whether its change committed: it must read again rather
than assume. psycopg2 speaks the simple query protocol (a ``Q`` message per statement,
parameters inlined), so the proxy reads every statement's text off the wire.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field

# Protocol version 3.0 in a StartupMessage; SSLRequest and GSSENCRequest codes, answered by
# one byte and followed by another untyped message.
_STARTUP = 196608
_NEGOTIATIONS = {80877103, 80877104}


@dataclass
class Cut:
    """What the proxy did with an armed cut."""

    trigger: str
    when: str  # "after" | "before"
    done: threading.Event = field(default_factory=threading.Event)
    # The statements of the transaction that was cut, in order.
    statements: list[str] = field(default_factory=list)


class CommitCutProxy:
    """Listens on 127.0.0.1; each accepted connection is piped to the server."""

    def __init__(self, server_host: str, server_port: int) -> None:
        self._server = (server_host, server_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: Cut | None = None
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, name="commit-cut-accept", daemon=True).start()

    def arm(self, trigger: str, when: str) -> Cut:
        """Cut the COMMIT of the next transaction that runs SQL containing `trigger`."""
        assert when in ("after", "before"), when
        cut = Cut(trigger, when)
        with self._lock:
            self._armed = cut
        return cut

    def close(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)

    def _take(self, statements: list[str]) -> Cut | None:
        """The armed cut when this transaction triggers it (it fires once)."""
        with self._lock:
            cut = self._armed
            if cut is None or not any(cut.trigger in text for text in statements):
                return None
            self._armed = None
            cut.statements = list(statements)
            return cut

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._server)
            with self._lock:
                self._sockets += [client, server]
            link = _Link(self, client, server)
            threading.Thread(target=link.pump_client, name="commit-cut-c2s", daemon=True).start()
            threading.Thread(target=link.pump_server, name="commit-cut-s2c", daemon=True).start()


class _Link:
    """One client connection and its server connection."""

    def __init__(self, proxy: CommitCutProxy, client: socket.socket, server: socket.socket):
        self.proxy, self.client, self.server = proxy, client, server
        # Set once the COMMIT of a cut went to the server: its answer is dropped.
        self.swallow: Cut | None = None

    def pump_client(self) -> None:
        """Client → server, message by message, watching each transaction's statements."""
        statements: list[str] = []
        try:
            self._startup()
            while True:
                header = _read(self.client, 5)
                kind, length = header[:1], struct.unpack("!I", header[1:])[0]
                body = _read(self.client, length - 4)
                if kind != b"Q":
                    self.server.sendall(header + body)
                    continue
                text = body.rstrip(b"\0").decode("utf-8", "replace")
                verb = text.strip().upper()
                if verb == "COMMIT":
                    cut = self.proxy._take(statements)
                    statements = []
                    if cut is not None:
                        self._cut(cut, header + body)
                        return
                elif verb == "ROLLBACK":
                    statements = []
                else:
                    statements.append(text)
                self.server.sendall(header + body)
        except OSError:
            pass
        finally:
            if self.swallow is None:  # else the other pump closes, once the answer came
                self._close()

    def _startup(self) -> None:
        """The untyped messages at the start: SSL/GSS requests, then the StartupMessage."""
        while True:
            length = struct.unpack("!I", _read(self.client, 4))[0]
            body = _read(self.client, length - 4)
            self.server.sendall(struct.pack("!I", length) + body)
            code = struct.unpack("!I", body[:4])[0]
            if code not in _NEGOTIATIONS:
                return

    def _cut(self, cut: Cut, commit: bytes) -> None:
        if cut.when == "after":
            # The server's answer (CommandComplete, sent once the commit is durable) is
            # dropped by the other pump, which then closes both sides.
            self.swallow = cut
            self.server.sendall(commit)
            return
        self._close()
        cut.done.set()

    def pump_server(self) -> None:
        """Server → client, as bytes; after a cut COMMIT, its answer is dropped."""
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    return
                if self.swallow is not None:
                    self._close()
                    self.swallow.done.set()
                    return
                self.client.sendall(data)
        except OSError:
            pass
        finally:
            self._close()

    def _close(self) -> None:
        _shut(self.client)
        _shut(self.server)


def _read(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
