"""A real host process on a private short home (the test kit's), plus this suite's helpers."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.client.start_request import start_payload
from pi_workflows.home import DATABASE_ENV
from pi_workflows.protocol.client_messages import SCHEMA
from pi_workflows.storage import StateStore, open_state
from pi_workflows.testing import WorkflowHost, installed_entry_points, short_temp_dir, wait_until
from pi_workflows.testing.host import FAST_TIMERS
from pi_workflows.testing.in_process import InProcessHost
from tests.conftest import REPO_ROOT


class HostHarness(WorkflowHost):
    """The kit's host with the inspection helpers the host tests share.

    Unlike the kit's default, every installed entry-point plugin loads (the suite runs in
    a venv with this repository's plugin distributions installed, and tests rely on them).
    With `database_url` the host, the CLI and :meth:`query` use that PostgreSQL database.
    """

    def __init__(
        self, root: Path, database_url: str | None = None, *, entry_points: Iterable[str] = ()
    ) -> None:
        super().__init__(root, entry_points=entry_points)
        self.database_url = database_url
        self._reader: Any = None  # psycopg2's connection for `query`, opened on first use
        if database_url is not None:
            self.env[DATABASE_ENV] = database_url

    def start_host(self, **extra_env: str) -> Any:
        """Start the host (the name these tests grew up with)."""
        return self.start(**extra_env)

    @property
    def config(self) -> Path:
        return self.config_dir

    def start_runs(self, workflow: str, count: int) -> list[str]:
        """`count` runs of `workflow` started by one `run.startBatch`; their ids."""
        client = self.client()
        try:
            payload = start_payload(workflow, self.project, None)
            return [started["runId"] for started in client.start_runs([payload] * count)]
        finally:
            client.close()

    def wait_for_pid(self, filename: str, previous: int | None = None) -> int:
        """The worker pid a test workflow wrote to `<project>/<filename>` (a new one)."""
        path = self.project / filename

        def read() -> int | None:
            text = path.read_text() if path.exists() else ""
            return int(text) if text and int(text) != previous else None

        return wait_until(read, what=f"a worker pid in {filename}")

    def query(self, sql: str, *params: Any) -> list[tuple]:
        """Read the state database directly (read-only, beside the live host).

        `?` marks a parameter on both backends.
        """
        if self.database_url is None:
            return super().query(sql, *params)
        import psycopg2

        # One connection for all of a test's reads: each new one is a server process
        # that loads the schema's catalog first, and tests poll with these reads. Opened
        # again after a failure (a test may restart the server under it).
        try:
            return self._read(sql, params)
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            self._close_reader()
            return self._read(sql, params)

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple]:
        import psycopg2

        if self._reader is None:
            self._reader = psycopg2.connect(self.database_url)
            self._reader.set_session(readonly=True, autocommit=True)
        with self._reader.cursor() as cursor:
            cursor.execute(sql.replace("%", "%%").replace("?", "%s"), params)
            return [_as_sqlite_returns(row) for row in cursor.fetchall()]

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def cleanup(self) -> None:
        self._close_reader()  # before the test's database is dropped
        super().cleanup()

    def open_store(self) -> StateStore:
        """The host's state database, opened in this process (close it when done)."""
        return open_state(self.home, self.database_url)

    def workers(self, run_id: str) -> list[tuple[int, str, int | None]]:
        return self.query(
            "SELECT generation, status, pid FROM run_workers WHERE run_id = ? ORDER BY generation",
            run_id,
        )


def request_frame(
    request_id: str, operation: str, payload: dict, *, client_id: str = "raw-client"
) -> bytes:
    """One client request as a raw protocol line (its idempotency key is its request id)."""
    request = {
        "schema": SCHEMA,
        "type": "request",
        "requestId": request_id,
        "clientId": client_id,
        "operation": operation,
        "idempotencyKey": request_id,
        "payload": payload,
    }
    return json.dumps(request).encode() + b"\n"


def send_together(harness: HostHarness, frames: list[bytes]) -> tuple[list[dict], list[dict]]:
    """Write the frames in one write on a new connection (the host reads them in one
    burst); the responses to them, in the order they came, and the events sent meanwhile."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(str(harness.home.socket_path))
        reader = sock.makefile("rb")
        assert json.loads(reader.readline())["type"] == "hello"
        sock.sendall(b"".join(frames))
        responses: list[dict] = []
        events: list[dict] = []
        while len(responses) < len(frames):
            message = json.loads(reader.readline())
            (responses if message["type"] == "response" else events).append(message)
        return responses, events


def _as_sqlite_returns(row: tuple) -> tuple:
    """PostgreSQL rows as SQLite returns them: bytes for blobs, ints for booleans."""
    return tuple(
        bytes(value)
        if isinstance(value, memoryview)
        else int(value)
        if isinstance(value, bool)
        else value
        for value in row
    )


class InProcessHarness(HostHarness, InProcessHost):
    """:class:`HostHarness` whose host runs in a thread of the test process (the kit's
    :class:`InProcessHost`): real socket, database and workers, no host process to kill."""

    def open_store(self) -> StateStore:
        """The running host's store: opening a second one in this process would repoint the
        process-wide database the host's thread uses. Its connections are per thread, so
        this thread reads and writes on its own connection; `close()` closes only that."""
        if self.host is None:
            return super().open_store()
        self.host.store.db.connect(reuse_if_open=True)
        return self.host.store


# Suites whose host-driven tests run on the in-process host, except those marked
# `integration` (they kill, signal or restart the host process). The others still start a
# host process per test.
IN_PROCESS_SUITES = (
    "tests/decisions/",
    "tests/terminal/",
    "tests/sessions/",
    "tests/host/",
    "tests/pi/",
)


def runs_in_process(request: pytest.FixtureRequest) -> bool:
    path = Path(request.node.path).relative_to(REPO_ROOT).as_posix()
    integration = request.node.get_closest_marker("integration") is not None
    return path.startswith(IN_PROCESS_SUITES) and not integration


@pytest.fixture
def harness(database_url: str | None, request: pytest.FixtureRequest) -> Iterator[HostHarness]:
    """A host home on the test's backend (both backends in the host-driven suites): the
    in-process host in the converted suites, a host process elsewhere or for `integration`."""
    kind = InProcessHarness if runs_in_process(request) else HostHarness
    harness = kind(short_temp_dir(), database_url, entry_points=installed_entry_points())
    try:
        yield harness
    finally:
        harness.cleanup()


__all__ = [
    "DATABASE_ENV",
    "FAST_TIMERS",
    "HostHarness",
    "InProcessHarness",
    "request_frame",
    "send_together",
    "wait_until",
]
