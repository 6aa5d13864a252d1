"""The worker's end of the bridge extension's socket.

The bridge extension (piw_pi/extensions/bridge/index.ts) connects to a private Unix socket
named by PI_WORKFLOWS_BRIDGE_SOCKET and sends one JSON line per `workflow` tool call:
``{"id": n, "type": "submit"|"update", "toolCallId": ..., "args": {...}}``. Each is answered
with ``{"id": n, "ok": true, "text": ..., "terminate": bool}`` or ``{"id": n, "ok": false,
"error": ...}`` by the handler of the step that is active now. The socket doubles as a
lifeline: the extension ends pi when the worker holding the other end goes away.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any

SOCKET_ENV = "PI_WORKFLOWS_BRIDGE_SOCKET"
MAX_LINE_BYTES = 4 * 1024 * 1024
NO_STEP = "No pi-workflows step is active in this pi session; there is nothing to submit to."

ToolCallHandler = Callable[[dict[str, Any]], dict[str, Any]]


class BridgeServer:
    """A listening socket in a fresh 0700 directory; `handler` answers tool calls."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="piw-bridge-")
        self.path = os.path.join(self.directory, "bridge.sock")
        self.handler: ToolCallHandler | None = None
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self._listener.listen(8)
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="pi-bridge-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                self._connections.append(connection)
            threading.Thread(
                target=self._serve, args=(connection,), name="pi-bridge-conn", daemon=True
            ).start()

    def _serve(self, connection: socket.socket) -> None:
        reader = connection.makefile("rb")
        try:
            for line in reader:
                if len(line) > MAX_LINE_BYTES:
                    break
                reply = self._answer(line)
                connection.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass
        finally:
            reader.close()

    def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            message = json.loads(line)
        except ValueError:
            return {"id": 0, "ok": False, "error": "The bridge sent a line that is not JSON."}
        request_id = message.get("id", 0) if isinstance(message, dict) else 0
        handler = self.handler
        if handler is None or not isinstance(message, dict):
            return {"id": request_id, "ok": False, "error": NO_STEP}
        try:
            reply = handler(message)
        except Exception as error:  # one bad call must not end the bridge
            reply = {"ok": False, "error": f"The workflow tool failed: {error}"}
        return {**reply, "id": request_id}

    def close(self) -> None:
        """Stop listening and drop every connection (the extensions then end their pi)."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
        except OSError:
            pass
        self._listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)
