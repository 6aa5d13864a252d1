"""The client socket: one asyncio server, many connections, one bad client at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from typing import TYPE_CHECKING

from .. import __version__
from ..errors import PiWorkflowsError
from ..protocol.client_messages import hello, parse_request, response
from ..protocol.framing import MAX_FRAME_BYTES, FrameError, decode_frame, encode_frame, valid_id
from .operations import KNOWN_OPERATIONS, Operations

if TYPE_CHECKING:
    from .runtime import Host

log = logging.getLogger(__name__)

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


class ClientServer:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.operations = Operations(host)
        self.server: asyncio.AbstractServer | None = None
        self.connections: set[asyncio.StreamWriter] = set()

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
        for writer in list(self.connections):
            writer.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)
        self.server = None

    @property
    def connected_clients(self) -> int:
        return len(self.connections)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        connection_id = f"connection-{secrets.token_hex(8)}"
        try:
            writer.write(encode_frame(hello(connection_id, __version__)))
            await writer.drain()
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    log.warning("closed a connection that sent a frame over 1 MiB")
                    return
                if not line:
                    return
                reply = await self._answer(line)
                if reply is None:
                    return
                writer.write(encode_frame(reply))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except Exception:
            log.exception("client connection failed")
        finally:
            self.connections.discard(writer)
            writer.close()

    async def _answer(self, line: bytes) -> dict | None:
        """The response to one frame, or None to close the connection."""
        try:
            message = decode_frame(line)
        except FrameError as error:
            log.warning("closed a connection: %s", error)
            return None
        try:
            request = parse_request(message, KNOWN_OPERATIONS)
        except FrameError as error:
            request_id = message.get("requestId")
            if not valid_id(request_id):
                log.warning("closed a connection: %s", error)
                return None
            return response(request_id, "rejected", error=str(error))
        return await self.operations.dispatch(request)
