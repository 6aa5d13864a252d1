"""The client socket: one asyncio server, many connections, one bad client at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import __version__, plugins
from ..errors import PiWorkflowsError
from ..protocol.client_messages import hello, parse_request, response
from ..protocol.framing import MAX_FRAME_BYTES, FrameError, decode_frame, encode_frame, valid_id
from .operations import Operations

if TYPE_CHECKING:
    from .runtime import Host

log = logging.getLogger(__name__)

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


class ClientServer:
    def __init__(self, host: Host, operations: Operations) -> None:
        self.host = host
        self.operations = operations
        self.server: asyncio.AbstractServer | None = None
        self.connections: set[ClientConnection] = set()
        # Plugins load once per process, so every hello can carry the same digest.
        self.plugin_set = plugins.plugin_set_digest()

    async def listen(self) -> None:
        path = self.host.home.socket_path
        if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
            raise PiWorkflowsError(
                f"Socket path {path} is longer than the OS allows ({MAX_SOCKET_PATH_BYTES} "
                "bytes); choose a shorter --home."
            )
        path.unlink(missing_ok=True)
        old_umask = os.umask(0o077)  # the socket is never visible with wider permissions
        try:
            self.server = await asyncio.start_unix_server(
                self._serve, path=str(path), limit=MAX_FRAME_BYTES + 1
            )
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.writer.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)
        self.server = None

    @property
    def connected_clients(self) -> int:
        return len(self.connections)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = ClientConnection(f"connection-{secrets.token_hex(8)}", writer)
        self.connections.add(connection)
        try:
            await connection.send(hello(connection.connection_id, __version__, self.plugin_set))
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    log.warning("closed a connection that sent a frame over 1 MiB")
                    return
                if not line:
                    return
                reply = await self._answer(line, connection)
                if reply is None:
                    return
                await connection.send(reply)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except Exception:
            log.exception("client connection failed")
        finally:
            self.connections.discard(connection)
            connection.closed()
            writer.close()

    async def _answer(self, line: bytes, connection: ClientConnection) -> dict | None:
        """The response to one frame, or None to close the connection."""
        try:
            message = decode_frame(line)
        except FrameError as error:
            log.warning("closed a connection: %s", error)
            return None
        try:
            request = parse_request(message, self.operations.known)
        except FrameError as error:
            request_id = message.get("requestId")
            if not valid_id(request_id):
                log.warning("closed a connection: %s", error)
                return None
            return response(request_id, "rejected", error=str(error))
        return await self.operations.dispatch(request, connection)


class ClientConnection:
    """One client: responses and pushed events share its writer, in order."""

    def __init__(self, connection_id: str, writer: asyncio.StreamWriter) -> None:
        self.connection_id = connection_id
        self.writer = writer
        self.is_open = True
        self._on_close: list[Callable[[], None]] = []
        self._lock = asyncio.Lock()

    async def send(self, message: dict) -> None:
        async with self._lock:
            self.writer.write(encode_frame(message))
            await self.writer.drain()

    def push(self, message: dict) -> None:
        """Send an event without waiting (views call this from synchronous code)."""
        if self.is_open:
            asyncio.get_running_loop().create_task(self._push(message))

    async def _push(self, message: dict) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.send(message)

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    def closed(self) -> None:
        self.is_open = False
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("connection close callback failed")
