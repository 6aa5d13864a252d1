"""The client socket: one asyncio server, many connections, one bad client at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import resource
import secrets
import socket
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import __version__, plugins, settings
from ..errors import DatabaseUnavailableError, PiWorkflowsError
from ..protocol.client_messages import ClientRequest, hello, parse_request, refused, response
from ..protocol.framing import (
    MAX_FRAME_BYTES,
    FrameError,
    decode_frame,
    encode_frame,
    one_line_error,
    valid_id,
)
from ..storage.database import is_disk_full
from . import lease_recovery
from .commit_group import HOLD_S
from .content_references import HeldContent, frame_within_limit
from .operations import Operations

if TYPE_CHECKING:
    from ..home import Home
    from ..settings import Settings
    from ..storage import StateStore
    from .commit_group import CommitGroup

log = logging.getLogger(__name__)

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# File descriptors kept free for the database, workers and their pipes.
RESERVED_FDS = 64
ACCEPT_RETRY_S = 0.5
# Requests one connection may have waiting for their answers; the next frame is read
# when one of them is answered.
MAX_REQUESTS_IN_FLIGHT = 32
READ_BYTES = 64 * 1024
# A request that found the database unavailable waits this long for it (the connection
# guard tries again at least every 2 s) before its client hears so: a server restart
# costs the requests during it some latency, not an error.
DATABASE_ANSWER_WAIT_S = 2.5


def max_connections() -> int:
    """The setting, lowered so that connections can never use up the fd limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = max(4, (soft - RESERVED_FDS) // 2)
    return min(settings.integer("max_connections"), ceiling)


class ClientServer:
    def __init__(
        self,
        operations: Operations,
        *,
        home: Home,
        host_settings: Settings,
        store: StateStore,
        commits: CommitGroup,
    ) -> None:
        self.operations = operations
        self.home = home
        self.store = store
        # Client `run.start`s go ahead of worker messages while a client streams them.
        self.commits = commits
        self.listener: socket.socket | None = None
        self.connections: set[ClientConnection] = set()
        # Plugins load once per process, so every hello can carry the same digest.
        self.plugin_set = plugins.plugin_set_digest()
        self.settings_fingerprints = host_settings.fingerprints()
        self._accepting: asyncio.Task | None = None
        self._serving: set[asyncio.Task] = set()  # one per accepted connection
        self.max_connections = max_connections()
        self.idle_timeout_s = settings.number("idle_connection_s")
        self._closing = False  # a request waiting for the database gives up then

    async def listen(self) -> None:
        path = self.home.socket_path
        if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
            raise PiWorkflowsError(
                f"Socket path {path} is longer than the OS allows ({MAX_SOCKET_PATH_BYTES} "
                "bytes); choose a shorter --home."
            )
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o077)  # the socket is never visible with wider permissions
        try:
            listener.bind(str(path))
        except OSError:
            listener.close()
            raise
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        listener.listen(128)
        listener.setblocking(False)
        self.listener = listener
        self._accepting = asyncio.get_running_loop().create_task(self._accept_loop())

    async def close(self) -> None:
        self._closing = True
        if self._accepting is not None:
            # Stopped before the listener closes, so no connection is left accepted but
            # never served (its client would wait for a hello until the process exits).
            self._accepting.cancel()
            await asyncio.wait([self._accepting])
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for connection in list(self.connections):
            connection.writer.close()
        if self._serving:
            await asyncio.wait(self._serving, timeout=2)

    @property
    def connected_clients(self) -> int:
        return len(self.connections)

    async def _accept_loop(self) -> None:
        """Accept one connection at a time, so a flood never holds more descriptors than
        the cap plus one: a connection over the cap is told why and closed at once."""
        loop = asyncio.get_running_loop()
        assert self.listener is not None
        while True:
            # Wait for a connection, then take it without another wait: a stop that
            # cancels this loop never drops a connection already taken from the listener
            # (as it did inside `loop.sock_accept`, whose result kept it open, unserved).
            await _readable(self.listener)
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                continue  # another wake-up took it, or the client gave up
            except OSError as error:  # out of descriptors: wait until some come back
                log.warning("cannot accept a connection: %s", error.strerror)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            conn.setblocking(False)
            if len(self._serving) >= self.max_connections:
                self._refuse(conn)
                continue
            task = loop.create_task(self._open(conn))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    def _refuse(self, conn: socket.socket) -> None:
        log.warning("refused a connection: %d connections are open", len(self._serving))
        refusal = refused(
            f"The workflow host has too many connections (limit {self.max_connections}); "
            "close idle clients or raise max_connections (PI_WORKFLOWS_MAX_CONNECTIONS)."
        )
        with contextlib.suppress(OSError):
            conn.send(encode_frame(refusal))  # a few bytes: fits any socket buffer
        conn.close()

    async def _open(self, conn: socket.socket) -> None:
        if self._closing:  # accepted as the stop began: closed, not left unserved
            conn.close()
            return
        try:
            reader, writer = await asyncio.open_unix_connection(
                sock=conn, limit=MAX_FRAME_BYTES + 1
            )
        except OSError:
            conn.close()
            return
        await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = ClientConnection(f"connection-{secrets.token_hex(8)}", writer)
        self.connections.add(connection)
        # Requests of one connection are answered as each finishes, so a slow one (a
        # submission waiting for its validator) never holds up the quick ones behind it.
        # Each starts in arrival order and runs to its first wait, which keeps the order
        # of everything that does not wait.
        answering: set[asyncio.Task] = set()
        try:
            await connection.send(
                hello(
                    connection.connection_id,
                    __version__,
                    self.plugin_set,
                    self.settings_fingerprints,
                )
            )
            frames = FrameSplitter()
            loop = asyncio.get_running_loop()
            first_frame_by = loop.time() + self.idle_timeout_s
            while True:
                try:
                    # A client that never sends a request must not hold a slot forever.
                    chunk = await asyncio.wait_for(
                        reader.read(READ_BYTES),
                        None if frames.seen_one else max(0.0, first_frame_by - loop.time()),
                    )
                except TimeoutError:
                    log.info("closed a connection that sent no request")
                    return
                lines = frames.split(chunk)
                if lines is None:
                    log.warning("closed a connection that sent a frame over 1 MiB")
                    return
                if not await self._answer_lines(lines, connection, answering):
                    return
                if not chunk:  # a client that closed its sending side still hears its answers
                    if answering:
                        await asyncio.wait(answering)
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except Exception:
            log.exception("client connection failed")
        finally:
            for task in answering:  # nobody is left to read these answers
                task.cancel()
            self.connections.discard(connection)
            connection.closed()
            writer.close()

    async def _answer_lines(
        self, lines: list[bytes], connection: ClientConnection, answering: set[asyncio.Task]
    ) -> bool:
        """Start answering the requests of the frames read together; False to close.

        Consecutive `run.start`s among them commit together (group commit, one fsync):
        at once when nothing read with them waits for its turn ahead of them, else as one
        task in their place in the order.
        """
        loop = asyncio.get_running_loop()
        starts: list[ClientRequest] = []
        queued_tasks = False
        for line in [*lines, None]:  # None ends the last group
            request = self._parse(line) if line is not None else None
            if isinstance(request, ClientRequest) and request.operation == "run.start":
                starts.append(request)
                continue
            if starts:
                if queued_tasks:
                    task = loop.create_task(self._answer_starts(starts, connection))
                    answering.add(task)
                    task.add_done_callback(answering.discard)
                else:
                    await self._answer_starts(starts, connection)
                starts = []
            if line is None:
                return True
            if request is None:
                return False
            if isinstance(request, dict):  # answered without dispatching
                await connection.send(request)
                continue
            # Any other request (the watch of a run just started, say) ends a hold: the
            # workers wait only for a stream of starts.
            self.commits.release()
            if len(answering) >= MAX_REQUESTS_IN_FLIGHT:
                await asyncio.wait(answering, return_when=asyncio.FIRST_COMPLETED)
            task = loop.create_task(self._answer(request, connection))
            answering.add(task)
            task.add_done_callback(answering.discard)
            queued_tasks = True
        return True

    def _parse(self, line: bytes) -> ClientRequest | dict | None:
        """The request in one frame, a `rejected` response to it, or None to close."""
        try:
            message = decode_frame(line, unique_keys=True)
        except FrameError as error:
            log.warning("closed a connection: %s", error)
            return None
        try:
            return parse_request(message, self.operations.known)
        except FrameError as error:
            request_id = message.get("requestId")
            if not valid_id(request_id):
                log.warning("closed a connection: %s", error)
                return None
            return response(request_id, "rejected", error=str(error))

    async def _answer(self, request: ClientRequest, connection: ClientConnection) -> None:
        reply = await self._dispatch(request, connection)
        if self._database_was_unavailable(reply) and await self._database_back():
            reply = await self._dispatch(request, connection)
        await self._send_answer(request, reply, connection)

    async def _dispatch(
        self, request: ClientRequest, connection: ClientConnection
    ) -> dict | Exception:
        try:
            return await self.operations.dispatch(request, connection)
        except Exception as error:  # the client hears why; the connection stays usable
            return error

    def _commit_starts(self, requests: list[ClientRequest]) -> list[dict | Exception]:
        try:
            return self.operations.commit_starts(requests)
        except Exception as error:
            return [error] * len(requests)

    def _database_was_unavailable(self, reply: dict | Exception) -> bool:
        if isinstance(reply, Exception):
            return isinstance(reply, DatabaseUnavailableError)
        return reply.get("outcome") == "unavailable" and bool(self.store.unavailable)

    async def _database_back(self) -> bool:
        """A request that found the database down, and so wrote nothing, is asked again
        once the server is back within DATABASE_ANSWER_WAIT_S (the first requests after a
        restart): its client never hears of a short outage."""
        return await lease_recovery.wait_for_database(
            self.store, lambda: self._closing, within_s=DATABASE_ANSWER_WAIT_S
        )

    async def _answer_starts(
        self, requests: list[ClientRequest], connection: ClientConnection
    ) -> None:
        loop = asyncio.get_running_loop()
        # A start read within a hold's time of the connection's previous answer: the
        # client streams starts, and worker messages wait for its next one.
        streaming = loop.time() - connection.start_answered_at < HOLD_S
        replies = self._commit_starts(requests)
        if any(map(self._database_was_unavailable, replies)) and await self._database_back():
            replies = self._commit_starts(requests)  # nothing of the group was written
        for request, reply in zip(requests, replies, strict=True):
            await self._send_answer(request, reply, connection)
        connection.start_answered_at = loop.time()
        if streaming:
            self.commits.hold()

    async def _send_answer(
        self, request: ClientRequest, reply: dict | Exception, connection: ClientConnection
    ) -> None:
        if isinstance(reply, DatabaseUnavailableError):
            reply = response(request.request_id, "unavailable", error=str(reply))
        elif isinstance(reply, Exception):
            log.error("%s failed", request.operation, exc_info=reply)
            reply = response(
                request.request_id,
                "unavailable",
                error=one_line_error(self._failure(request.operation, reply)),
            )
        with contextlib.suppress(ConnectionError, RuntimeError):
            try:
                await connection.send(reply)
            except FrameError as error:  # not a receipt that references could shrink
                log.warning("%s: the answer does not fit a frame: %s", request.operation, error)
                await connection.send(
                    response(
                        request.request_id,
                        "unavailable",
                        error=f"The answer to {request.operation} is over the 1 MiB protocol "
                        "limit.",
                    )
                )

    def _failure(self, operation: str, error: Exception) -> str:
        location = self.store.location
        if is_disk_full(error):
            return (
                f"The workflow host cannot write its state at {location}: the disk is full. "
                "Free space there and retry."
            )
        return (
            f"The workflow host failed to handle {operation}: {type(error).__name__}: "
            f"{error}; see its log."
        )


async def _readable(sock: socket.socket) -> None:
    """Until `sock` is readable (a listener: a connection waits to be accepted)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


class FrameSplitter:
    """Newline-delimited frames out of the chunks a connection reads."""

    def __init__(self) -> None:
        self._partial = b""
        self.seen_one = False

    def split(self, chunk: bytes) -> list[bytes] | None:
        """The frames `chunk` completes (at the end of the stream, b"", the unfinished
        one too); None for a frame over the limit."""
        if not chunk:
            last, self._partial = self._partial, b""
            return [last] if last else []
        if b"\n" not in chunk:
            self._partial += chunk
            return None if len(self._partial) >= MAX_FRAME_BYTES else []
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) >= MAX_FRAME_BYTES or any(
            len(line) >= MAX_FRAME_BYTES for line in lines
        ):
            return None
        self.seen_one = True
        return lines


class ClientConnection:
    """One client: responses and pushed events share its writer, in order."""

    def __init__(self, connection_id: str, writer: asyncio.StreamWriter) -> None:
        self.connection_id = connection_id
        self.writer = writer
        self.is_open = True
        self.start_answered_at = -math.inf  # loop time of its last run.start answer
        self._on_close: list[Callable[[], None]] = []
        self._lock = asyncio.Lock()
        # Events not written yet, each with the key a newer one replaces it by (or None).
        self._pushes: deque[tuple[str | None, dict]] = deque()
        self._pusher: asyncio.Task | None = None
        # Values of answers too big for a frame, until the client reads them back.
        self.content = HeldContent()

    async def send(self, message: dict) -> None:
        async with self._lock:
            self.writer.write(frame_within_limit(message, self.content))
            await self.writer.drain()

    def push(self, message: dict, *, replaces: str | None = None) -> None:
        """Send an event without waiting (views call this from synchronous code).

        Events wait in order for one writer. An event sent with `replaces` (a whole view,
        keyed by its subscription) drops the unsent one of the same key: while the client
        is slow to read, only its latest view waits behind the write in progress, not one
        view per change.
        """
        if not self.is_open:
            return
        if replaces is not None:
            self._pushes = deque(entry for entry in self._pushes if entry[0] != replaces)
        self._pushes.append((replaces, message))
        if self._pusher is None:
            self._pusher = asyncio.get_running_loop().create_task(self._write_pushes())

    async def _write_pushes(self) -> None:
        try:
            while self._pushes and self.is_open:
                _, message = self._pushes.popleft()
                await self.send(message)
        except (ConnectionError, RuntimeError):
            self._pushes.clear()  # the client is gone: nothing is left to wait for
        finally:
            self._pusher = None

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
