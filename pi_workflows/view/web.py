"""`pi-workflows view --web`: the same app in a browser, served by textual-serve.

Each browser session runs `pi-workflows view` as its own process (textual-serve's web
driver) in this home. The server listens on 127.0.0.1 only and answers only requests
that carry its token — `?token=` in the URL it prints, or the cookie the first page
sets so the page's own requests (its script, its websocket) carry it too; any other
request gets 403. The token is new at each start and kept 0600 beside the host's socket
while the server runs. Requests are not logged: their URLs hold the token.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from aiohttp import web
from textual_serve.server import Server

from ..home import DATABASE_ENV, HOME_ENV, Home

TOKEN_FILE = "view-web.token"
COOKIE = "piw_view_token"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenServer(Server):
    """textual-serve's server with every request checked against `token`."""

    def __init__(self, command: str, port: int, token: str) -> None:
        super().__init__(command, host="127.0.0.1", port=port, title="pi-workflows view")
        self.token = token

    def initialize_logging(self) -> None:
        # Not textual-serve's: its tracebacks show local values (a request's token), and
        # the access log's lines hold the URLs.
        logging.basicConfig(level=logging.INFO, format="pi-workflows view: %(message)s")
        logging.getLogger("aiohttp.access").disabled = True

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        token = self.token

        @web.middleware
        async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await _checked(request, handler, token)

        app.middlewares.append(require_token)
        return app


async def _checked(request: web.Request, handler: Handler, token: str) -> web.StreamResponse:
    """403 unless the request carries the token (in the URL, or the first page's cookie)."""
    given = request.query.get("token") or request.cookies.get(COOKIE) or ""
    if not secrets.compare_digest(given.encode(), token.encode()):
        return web.Response(
            status=403, text="Forbidden: open the URL `pi-workflows view --web` printed.\n"
        )
    response = await handler(request)
    if request.path == "/" and "token" in request.query:
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
    return response


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def token_file(home: Home) -> Iterator[str]:
    """A new token, written 0600 beside the host's socket until the server stops."""
    token = secrets.token_urlsafe(24)
    path = Path(home.socket_path).parent / TOKEN_FILE
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(token + "\n")
    try:
        yield token
    finally:
        path.unlink(missing_ok=True)


def serve(home: Home, database_url: str | None, run_id: str | None, port: int | None) -> None:
    """Serve the viewer until interrupted; prints the URL to open (with its token)."""
    # The sessions' processes find the home and database in their environment, so
    # neither (nor a database password) appears in a command line.
    os.environ[HOME_ENV] = str(home.root)
    if database_url is not None:
        os.environ[DATABASE_ENV] = database_url
    command = shlex.join(
        [sys.executable, "-m", "pi_workflows", "view", *([run_id] if run_id else [])]
    )
    port = port or free_port()
    with token_file(home) as token:
        print(f"pi-workflows view: open http://127.0.0.1:{port}/?token={token}", flush=True)
        TokenServer(command, port, token).serve()
