"""What a plugin may read of the state: `StateView`, from `pi_workflows.plugin`.

Every answer is one query of the state database at the time of the call, so on
PostgreSQL it covers every host that shares the database, and nothing is cached that
could go stale. A call works from any thread: on a thread without a connection (a
plugin's own, or a hook deadline's helper) it opens one for the query and closes it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import peewee

from ..errors import PiWorkflowsError
from ..records import RunRecord
from . import runs
from .models import database_proxy


class StateView:
    """Read-only, thread-safe queries of the state database for plugins."""

    def running_runs(
        self, *, workflow_name: str | None = None, host_id: str | None = None
    ) -> list[RunRecord]:
        """Runs with a worker starting or running, on any host, the longest running
        first: only those of `workflow_name`, and only those `host_id` (a
        ``HostInfo.host_id``) holds the claim of, when given."""
        with _connected():
            return runs.running_run_records(workflow_name, host_id)

    def queue_depth(self, *, workflow_name: str | None = None) -> int:
        """How many runs wait for a worker (queued and not paused), of `workflow_name`
        when given."""
        with _connected():
            return runs.queued_run_count(workflow_name)

    def run(self, run_id: str) -> RunRecord | None:
        """The run's record as hooks see it, or ``None`` when there is no such run."""
        with _connected():
            found = runs.run_records([run_id])
        return found[0] if found else None


def state_view() -> StateView:
    """The view of this process's state database (the host's, in a host)."""
    return StateView()


@contextlib.contextmanager
def _connected() -> Iterator[None]:
    database = database_proxy.obj
    if database is None:
        raise PiWorkflowsError(
            "No state database is open in this process; read the state view from a hook "
            "the host or the command line calls."
        )
    assert isinstance(database, peewee.Database)
    opened_here = database.is_closed()  # per thread: each thread has its own connection
    if opened_here:
        database.connect()
    try:
        yield
    finally:
        if opened_here:
            database.close()
