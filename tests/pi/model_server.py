"""A scripted OpenAI-compatible model server on a real socket, for driving the real `pi` offline.

The server speaks the parts of the OpenAI Chat Completions API that Pi's `openai-completions`
provider uses: `POST /v1/chat/completions` (SSE streaming when the request says `"stream":
true`, one JSON body otherwise) and `GET /v1/models`. Each test gives it a script: the replies
to the next chat requests, in order. A reply is one of

- `Text("...")`                         an assistant message with that text;
- `ToolCalls(ToolCall("workflow", {...}), text="")`  tool calls (and optional text before them);
- `HttpError(503, "overloaded")`        an HTTP error status with an OpenAI-style error body;
- `MalformedStream()`                   a 200 SSE stream that breaks off with invalid JSON;
- `Hold()`                              a stream that sends nothing until the client goes away
                                        or the test calls `release_holds()` (a model turn
                                        that is in progress when a test kills or cancels);
- a callable `reply(request) -> Reply`  decides at request time, e.g. to echo an id that only
                                        the prompt carries.

Every request is logged as a `ModelRequest` (`server.requests`), whether or not the script had
a reply for it. A request beyond the script gets HTTP 500 "script exhausted" unless the server
has a `default` reply, so a test whose agent talks more than expected fails loudly.

Usage::

    with ScriptedModelServer() as server:
        server.script(ToolCalls(ToolCall("workflow", {"action": "submit", ...})), Text("done"))
        ... run pi with base URL server.base_url ...
        assert server.requests[1].tool_results()[0]["content"] == "..."
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL_ID = "scripted-model"


@dataclass(frozen=True)
class ToolCall:
    """One function call the model makes; `id` defaults to `call_<request>_<index>`."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None

    def arguments_json(self) -> str:
        """The arguments as the JSON string the API carries (a str is sent verbatim)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class Text:
    """An assistant message with this text (streamed in `chunk_chars`-sized deltas)."""

    text: str
    chunk_chars: int = 16


@dataclass(frozen=True)
class ToolCalls:
    """An assistant message that calls tools (finish reason `tool_calls`), after optional text."""

    calls: tuple[ToolCall, ...]
    text: str = ""

    def __init__(self, *calls: ToolCall, text: str = "") -> None:
        object.__setattr__(self, "calls", tuple(calls))
        object.__setattr__(self, "text", text)


@dataclass(frozen=True)
class HttpError:
    """An HTTP error response with an OpenAI-style `{"error": {...}}` body."""

    status: int
    message: str = "scripted error"


@dataclass(frozen=True)
class MalformedStream:
    """A 200 SSE response that sends one good chunk, then a line that is not JSON, then closes."""


@dataclass(frozen=True)
class Hold:
    """A 200 SSE response that sends nothing until the client disconnects or holds are released.

    Released holds end the stream with `then` (default: a short text reply).
    """

    then: Text | ToolCalls = field(default_factory=lambda: Text("released"))


Reply = Text | ToolCalls | HttpError | MalformedStream | Hold
ScriptEntry = Reply | Callable[["ModelRequest"], Reply]


@dataclass
class ModelRequest:
    """One request the server received, in arrival order (`index` counts chat requests only)."""

    index: int
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float
    reply: Reply | None = None
    finished_at: float | None = None
    """`time.monotonic()` when the server had sent its whole answer (None while it works)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages the client sent (system/developer, user, assistant, tool)."""
        return list(self.body.get("messages") or [])

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tool definitions the client offered (`{"type": "function", "function": {...}}`)."""
        return list(self.body.get("tools") or [])

    def tool(self, name: str) -> dict[str, Any] | None:
        """The `function` object of the offered tool `name`, or None."""
        for tool in self.tools:
            function = tool.get("function") or {}
            if function.get("name") == name:
                return function
        return None

    def text_of(self, message: dict[str, Any]) -> str:
        """A message's content as plain text (string content or the text parts joined)."""
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return ""

    def user_texts(self) -> list[str]:
        """The text of every user message, oldest first."""
        return [self.text_of(m) for m in self.messages if m.get("role") == "user"]

    def last_user_text(self) -> str:
        """The text of the newest user message ("" when there is none)."""
        texts = self.user_texts()
        return texts[-1] if texts else ""

    def tool_results(self) -> list[dict[str, Any]]:
        """The `role: "tool"` messages (`tool_call_id`, `content` as text), oldest first."""
        return [
            {"tool_call_id": m.get("tool_call_id"), "content": self.text_of(m)}
            for m in self.messages
            if m.get("role") == "tool"
        ]

    def all_text(self) -> str:
        """Every message's text joined by newlines, for "does the model see X" assertions."""
        return "\n".join(self.text_of(m) for m in self.messages)


class ScriptedModelServer:
    """An OpenAI-compatible chat server on 127.0.0.1 whose replies come from a test's script.

    Thread-safe: the HTTP server answers on its own threads while the test scripts and reads
    the log. Use as a context manager, or call `start()`/`stop()`.
    """

    def __init__(self, default: ScriptEntry | None = None, model_id: str = MODEL_ID) -> None:
        self.model_id = model_id
        self.default = default
        self._script: list[ScriptEntry] = []
        self._requests: list[ModelRequest] = []
        self._lock = threading.Condition()
        self._holds_released = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> ScriptedModelServer:
        """Bind an ephemeral port and serve on a daemon thread."""
        handler = _handler_for(self)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="scripted-model-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release held streams, stop serving and close the socket (a later connect is refused)."""
        self.release_holds()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """The `baseUrl` for Pi's models.json (`http://127.0.0.1:PORT/v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # --- scripting ------------------------------------------------------------------------

    def script(self, *entries: ScriptEntry) -> None:
        """Append replies for the next chat requests, in order."""
        with self._lock:
            self._script.extend(entries)

    def remaining(self) -> int:
        """How many scripted replies have not been used yet."""
        with self._lock:
            return len(self._script)

    def release_holds(self) -> None:
        """Let every `Hold` reply (current and future) finish with its `then` reply."""
        self._holds_released.set()

    # --- the request log ------------------------------------------------------------------

    @property
    def requests(self) -> list[ModelRequest]:
        """A snapshot of the chat-completion requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def wait_for_requests(self, count: int, timeout: float = 30.0) -> list[ModelRequest]:
        """Block until at least `count` chat requests arrived; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self._requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"model server got {len(self._requests)} chat requests, "
                        f"expected {count} within {timeout}s"
                    )
                self._lock.wait(left)
            return list(self._requests)

    def _record(self, method: str, path: str, headers: dict[str, str], body: dict) -> ModelRequest:
        with self._lock:
            request = ModelRequest(
                index=len(self._requests),
                method=method,
                path=path,
                headers=headers,
                body=body,
                received_at=time.monotonic(),
            )
            entry = self._script.pop(0) if self._script else self.default
            reply = entry(request) if callable(entry) else entry
            request.reply = reply
            self._requests.append(request)
            self._lock.notify_all()
            return request


def _handler_for(server: ScriptedModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the request log is the record."""

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                body = {
                    "object": "list",
                    "data": [{"id": server.model_id, "object": "model", "owned_by": "tests"}],
                }
                self._send_json(200, body)
            else:
                self._send_json(404, _error_body(f"no route {self.path}"))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send_json(400, _error_body("request body is not JSON"))
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send_json(404, _error_body(f"no route {self.path}"))
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            request = server._record("POST", self.path, headers, body)
            try:
                self._answer(request)
            finally:
                request.finished_at = time.monotonic()

        def _answer(self, request: ModelRequest) -> None:
            body = request.body
            reply = request.reply
            if reply is None:
                self._send_json(500, _error_body("scripted model server: script exhausted"))
                return
            if isinstance(reply, HttpError):
                self._send_json(reply.status, _error_body(reply.message))
                return
            if isinstance(reply, Hold):
                reply = self._hold(reply)
                if reply is None:
                    return
            streaming = bool(body.get("stream"))
            if isinstance(reply, MalformedStream):
                self._send_malformed()
            elif streaming:
                self._send_stream(request.index, reply)
            else:
                self._send_json(200, _completion(server.model_id, request.index, reply))

        def _hold(self, reply: Hold) -> Text | ToolCalls | None:
            """Open the stream and wait; None when the client went away first."""
            self._start_sse()
            while not server._holds_released.wait(0.05):
                if _peer_closed(self.connection):
                    self.close_connection = True
                    return None
            return reply.then

        def _send_json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _start_sse(self) -> None:
            if getattr(self, "_sse_started", False):
                return
            self._sse_started = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def _event(self, payload: dict | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        def _send_stream(self, index: int, reply: Text | ToolCalls) -> None:
            self._start_sse()
            try:
                for chunk in _chunks(server.model_id, index, reply):
                    self._event(chunk)
                self._event("[DONE]")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _send_malformed(self) -> None:
            self._start_sse()
            try:
                self._event(_chunk(server.model_id, 0, {"role": "assistant", "content": "par"}))
                self._event('{"id": "broken", "choices": [{"delta": {"content": "tial')
            except (BrokenPipeError, ConnectionResetError):
                pass

    return Handler


def _peer_closed(connection: Any) -> bool:
    """True once the client has closed its end (a readable socket with no data)."""
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _error_body(message: str) -> dict:
    return {"error": {"message": message, "type": "scripted_error", "code": None}}


def _chunk(model: str, index: int, delta: dict, finish_reason: str | None = None) -> dict:
    return {
        "id": f"chatcmpl-{index}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _usage() -> dict:
    return {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _call_id(index: int, position: int, call: ToolCall) -> str:
    return call.id or f"call_{index}_{position}"


def _chunks(model: str, index: int, reply: Text | ToolCalls) -> Iterator[dict]:
    yield _chunk(model, index, {"role": "assistant", "content": ""})
    text = reply.text
    size = reply.chunk_chars if isinstance(reply, Text) else 64
    for start in range(0, len(text), max(size, 1)):
        yield _chunk(model, index, {"content": text[start : start + size]})
    finish = "stop"
    if isinstance(reply, ToolCalls):
        finish = "tool_calls"
        for position, call in enumerate(reply.calls):
            opening = {
                "index": position,
                "id": _call_id(index, position, call),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            yield _chunk(model, index, {"tool_calls": [opening]})
            arguments = call.arguments_json()
            for start in range(0, len(arguments), 64):
                piece = {
                    "index": position,
                    "function": {"arguments": arguments[start : start + 64]},
                }
                yield _chunk(model, index, {"tool_calls": [piece]})
    yield _chunk(model, index, {}, finish)
    final = _chunk(model, index, {})
    final["choices"] = []
    final["usage"] = _usage()
    yield final


def _completion(model: str, index: int, reply: Text | ToolCalls) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    finish = "stop"
    if isinstance(reply, ToolCalls):
        finish = "tool_calls"
        message["tool_calls"] = [
            {
                "id": _call_id(index, position, call),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json()},
            }
            for position, call in enumerate(reply.calls)
        ]
    return {
        "id": f"chatcmpl-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": _usage(),
    }
