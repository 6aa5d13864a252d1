"""One socket connection to the host: hello, requests, responses (SPEC §8)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..canonical import canonical_json
from ..errors import (
    HostBusyError,
    HostProtocolError,
    HostUnavailableError,
    HostVersionError,
    InvalidInputError,
    PiWorkflowsError,
    UnsafeHomeError,
)
from ..home import check_private_dir
from ..limits import human_size
from ..protocol.client_messages import SCHEMA, check_host_message
from ..protocol.framing import MAX_FRAME_BYTES, FrameError, decode_frame
from .content import ContentError, materialize, needs_decoding

# Requests a pipelining client keeps unanswered; the host reads at most 32 ahead per
# connection (host/server.py MAX_REQUESTS_IN_FLIGHT).
PIPELINE_WINDOW = 32


@dataclass(frozen=True)
class Response:
    request_id: str
    outcome: str
    receipt: Any = None
    error: str | None = None
    revision: int | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in ("accepted", "adopted")


class HostConnection:
    """A blocking connection; one request at a time, events are skipped (unless the
    request asks for them)."""

    def __init__(
        self, socket_path: Path, timeout_s: float = 30.0, *, client_id: str | None = None
    ) -> None:
        self.socket_path = socket_path
        self.client_id = client_id or f"client-{secrets.token_hex(8)}"
        check_socket_path(socket_path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(str(socket_path))
        except OSError as error:
            self._sock.close()
            raise HostUnavailableError(
                f"No workflow host answers at {socket_path}: {error}"
            ) from None
        try:
            check_peer(self._sock, socket_path)
        except UnsafeHomeError:
            self._sock.close()
            raise
        self._reader = self._sock.makefile("rb")
        try:
            self.hello = self._read_line()
        except (OSError, FrameError) as error:
            self.close()
            raise HostUnavailableError(
                f"The workflow host did not greet this client: {error}"
            ) from None
        except HostUnavailableError:
            self.close()
            raise
        if self.hello.get("type") == "refused":
            self.close()
            raise HostBusyError(str(self.hello.get("error") or "The workflow host is busy."))
        if self.hello.get("type") != "hello":
            self.close()
            raise HostUnavailableError("The workflow host did not greet this client.")
        if self.hello.get("packageVersion") != __version__:
            self.close()
            raise HostVersionError(
                f"The workflow host at {socket_path} runs pi-workflows "
                f"{str(self.hello.get('packageVersion'))[:40]}, this client is {__version__}; "
                "stop it with 'pi-workflows host stop' (the next command starts this version)."
            )
        try:  # the same version: the whole hello must be as this version sends it
            check_host_message(self.hello)
        except FrameError as error:
            self.close()
            raise _protocol_error(error) from None

    def _read_line(self) -> dict[str, Any]:
        """The next message as JSON, unchecked (the hello is checked after its version)."""
        line = self._reader.readline(MAX_FRAME_BYTES + 1)
        if not line:
            raise HostUnavailableError("The workflow host closed the connection.")
        return decode_frame(line)

    def _read_message(self) -> dict[str, Any]:
        """The next response or event; a `HostProtocolError` (the connection closed) for
        anything else or anything malformed."""
        try:
            message = check_host_message(self._read_line())
            if message["type"] not in ("response", "event"):
                raise FrameError(f"Unexpected {message['type']} after the hello")
        except FrameError as error:
            self.close()
            raise _protocol_error(error) from None
        return message

    def request(
        self,
        operation: str,
        payload: dict[str, Any] | None = None,
        *,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        **envelope: Any,
    ) -> Response:
        """Send a request (`envelope`: the keyword arguments of `post`), wait for its response.

        `on_event` is given each event that arrives meanwhile (a long operation's progress,
        sent with the request id as its subscription id); they are skipped otherwise.
        """
        request_id = self.post(operation, payload, **envelope)
        try:
            while True:
                reply = self._read_message()
                if reply.get("type") == "response" and reply.get("requestId") == request_id:
                    break
                if on_event is not None and reply["type"] == "event":
                    on_event(reply)
        except (OSError, ValueError) as error:
            raise HostUnavailableError(
                f"Lost the connection to the workflow host: {error}"
            ) from None
        return self._response(request_id, reply)

    def post(
        self,
        operation: str,
        payload: dict[str, Any] | None = None,
        *,
        run_id: str | None = None,
        request_id: str | None = None,
        idempotency_key: str | None = None,
        expected_revision: int | None = None,
    ) -> str:
        """Send a request without waiting for its response; returns its request id.

        A later `request` skips the response when it comes.
        """
        request_id = request_id or f"request-{secrets.token_hex(12)}"
        frame = self._frame(
            operation, payload, request_id, idempotency_key, run_id, expected_revision
        )
        try:
            self._sock.sendall(frame)
        except OSError as error:
            raise HostUnavailableError(
                f"Lost the connection to the workflow host: {error}"
            ) from None
        return request_id

    def request_pipelined(
        self,
        operation: str,
        payloads: list[dict[str, Any]],
        request_ids: list[str],
        *,
        window: int = PIPELINE_WINDOW,
    ) -> list[Response]:
        """One request per payload, up to `window` of them sent before the first answer
        is read (the host reads them in one burst and commits them together); the
        answers, in the order of `payloads`. Each request is its own command with its
        own receipt, answered only after its commit."""
        wanted = set(request_ids)
        if len(wanted) != len(payloads):
            raise ValueError("one distinct request id per payload")
        frames = [
            self._frame(operation, payload, request_id, None, None, None)
            for payload, request_id in zip(payloads, request_ids, strict=True)
        ]
        replies: dict[str, dict[str, Any]] = {}
        sent = 0
        try:
            while len(replies) < len(frames):
                if sent < len(frames) and sent - len(replies) < window:
                    end = min(len(frames), len(replies) + window)
                    self._sock.sendall(b"".join(frames[sent:end]))
                    sent = end
                reply = self._read_message()
                if reply.get("type") == "response" and reply.get("requestId") in wanted:
                    replies[reply["requestId"]] = reply
        except (OSError, ValueError) as error:
            raise HostUnavailableError(
                f"Lost the connection to the workflow host: {error}"
            ) from None
        # Read back values too big for a frame only now, with no request outstanding.
        return [self._response(request_id, replies[request_id]) for request_id in request_ids]

    def _frame(
        self,
        operation: str,
        payload: dict[str, Any] | None,
        request_id: str,
        idempotency_key: str | None,
        run_id: str | None,
        expected_revision: int | None,
    ) -> bytes:
        message: dict[str, Any] = {
            "schema": SCHEMA,
            "type": "request",
            "requestId": request_id,
            "clientId": self.client_id,
            "operation": operation,
            "idempotencyKey": idempotency_key or request_id,
            "payload": payload or {},
        }
        if run_id is not None:
            message["runId"] = run_id
        if expected_revision is not None:
            message["expectedRevision"] = expected_revision
        frame = canonical_json(message).encode("utf-8") + b"\n"
        if len(frame) > MAX_FRAME_BYTES:
            raise InvalidInputError(
                f"The {operation} request is {human_size(len(frame))}, over the 1 MiB protocol "
                "limit; nothing was sent. See the limits in docs/operations.md."
            )
        return frame

    def _response(self, request_id: str, reply: dict[str, Any]) -> Response:
        receipt = reply.get("receipt")
        if needs_decoding(receipt):  # references to read back, user values to unwrap
            receipt = materialize(receipt, self._read_chunk)
        return Response(
            request_id=request_id,
            outcome=reply["outcome"],
            receipt=receipt,
            error=reply.get("error"),
            revision=reply.get("revision"),
        )

    def _read_chunk(self, sha256: str, size: int, offset: int) -> dict[str, Any]:
        answer = self.request("content.read", {"sha256": sha256, "bytes": size, "offset": offset})
        if not answer.ok:
            raise ContentError(answer.error or f"Reading content {sha256[:16]}… failed.")
        chunk: dict[str, Any] = answer.receipt
        return chunk

    def close(self) -> None:
        # Shut the socket down first: a thread blocked reading events then wakes up and
        # lets go of the reader, which close() would otherwise wait for forever.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._reader.close()
        self._sock.close()

    def __enter__(self) -> HostConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_socket_path(socket_path: Path) -> None:
    """Before connecting: the home, its host directory and the socket are ours alone.

    The same checks the host applies to its home; anyone who could write there could
    put their own socket in place of the host's and read every request.
    """
    for directory in (socket_path.parent.parent, socket_path.parent):
        if not directory.is_dir():
            raise HostUnavailableError(f"No workflow host has used {directory} yet.")
        check_private_dir(directory)
    try:
        info = socket_path.lstat()
    except FileNotFoundError:
        raise HostUnavailableError(f"No workflow host socket at {socket_path}.") from None
    if not stat.S_ISSOCK(info.st_mode):
        raise UnsafeHomeError(f"{socket_path} is not a socket; remove it and start the host.")
    if info.st_uid != os.getuid():
        raise UnsafeHomeError(
            f"The workflow host socket {socket_path} is owned by uid {info.st_uid}, not by "
            f"you (uid {os.getuid()}); nothing was sent. Remove it or use another --home."
        )


def check_peer(sock: socket.socket, socket_path: Path) -> None:
    """After connecting: the process serving the socket runs as us (or as root)."""
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", credentials)
    if uid not in (os.getuid(), 0):
        raise UnsafeHomeError(
            f"The process serving {socket_path} (PID {pid}) runs as uid {uid}, not as you "
            f"(uid {os.getuid()}) or root; nothing was sent. Stop it and check who can "
            f"write to {socket_path.parent}."
        )


def _protocol_error(error: FrameError) -> HostProtocolError:
    return HostProtocolError(
        f"The workflow host sent a malformed message ({error}); the connection is closed. "
        "Check that the host and this client are the same pi-workflows version."
    )


class RequestFailed(PiWorkflowsError):
    """The host answered with an outcome other than accepted/adopted."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.error or f"The host answered {response.outcome}.")
        self.response = response
