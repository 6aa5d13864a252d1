"""What a plugin may read of the state: `StateView`, from `pi_workflows.plugin`.

Every answer is one query of the state database at the time of the call, so on
PostgreSQL it covers every host that shares the database, and nothing is cached that
could go stale. A call works from any thread. Peewee keeps one connection per thread; on
a thread that has none (a plugin's notification thread, a hook deadline's helper, a
plugin's own) the view opens one and keeps it for the thread's next calls, because a
notification thread reads the view over and over and opening a connection costs more
than the query (a new PostgreSQL session, or SQLite's file open and pragmas). The
connection goes with its thread; on PostgreSQL one the server dropped is replaced by the
store's connection guard at the next call, as the host's own is. At most
`MAX_KEPT_CONNECTIONS` are kept (`host status` shows them, `connection_use`); a thread
past them opens one for each call and closes it after.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import peewee

from ..errors import PiWorkflowsError
from ..records import RunRecord
from . import connection_use, runs
from .models import database_proxy


class StateView:
    """Read-only, thread-safe queries of the state database for plugins."""

    def running_runs(
        self, *, workflow_name: str | None = None, host_id: str | None = None
    ) -> list[RunRecord]:
        """Runs with a worker starting or running, on any host, the longest running
        first: only those of `workflow_name`, and only those `host_id` (a
        ``HostInfo.host_id``) holds the claim of, when given."""
        with _connected_this_thread():
            return runs.running_run_records(workflow_name, host_id)

    def queue_depth(self, *, workflow_name: str | None = None) -> int:
        """How many runs wait for a worker (queued and not paused), of `workflow_name`
        when given."""
        with _connected_this_thread():
            return runs.queued_run_count(workflow_name)

    def run(self, run_id: str) -> RunRecord | None:
        """The run's record as hooks see it, or ``None`` when there is no such run."""
        with _connected_this_thread():
            found = runs.run_records([run_id])
        return found[0] if found else None


def state_view() -> StateView:
    """The view of this process's state database (the host's, in a host)."""
    return StateView()


class _Opened(threading.local):
    """The database whose connection the view opened on this thread, if any."""

    database: peewee.Database | None = None


_opened = _Opened()

# Connections the view keeps open between calls, one per thread, in all: on PostgreSQL
# each is a server session. A thread past them opens one for each call.
MAX_KEPT_CONNECTIONS = 8


@contextlib.contextmanager
def _connected_this_thread() -> Iterator[None]:
    """A connection for this thread's call: kept for its next calls while fewer than
    `MAX_KEPT_CONNECTIONS` are kept, else closed after this one."""
    opened = _connect_this_thread()
    try:
        yield
    finally:
        if opened and _kept_connections() > MAX_KEPT_CONNECTIONS:
            _close_opened()


def _kept_connections() -> int:
    use = connection_use.ConnectionUse.on(database_proxy.obj)
    return 0 if use is None else use.counts().get(connection_use.STATE_VIEW, 0)


def _connect_this_thread() -> bool:
    """Connect this thread if it has no connection; True if it opened one."""
    database = database_proxy.obj
    if database is None:
        raise PiWorkflowsError(
            "No state database is open in this process; read the state view from a hook "
            "the host or the command line calls."
        )
    assert isinstance(database, peewee.Database)
    if database.is_closed():  # per thread: each thread has its own connection
        _close_opened()  # one kept for a database this process has since replaced
        with connection_use.connecting_for(connection_use.STATE_VIEW):
            database.connect()
        _opened.database = database
        return True
    return False


def _close_opened() -> None:
    database, _opened.database = _opened.database, None
    if database is not None:
        with contextlib.suppress(Exception):  # a dead connection may fail to close
            database.close()
