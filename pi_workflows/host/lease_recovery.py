"""Carrying on after the database connection or the host's lease went away for a while.

A PostgreSQL server that restarts drops the host's connection (see
`storage/connection_guard.py`); a host that was stopped (SIGSTOP, a suspended laptop)
or could not reach its database longer than its lease finds the lease expired. Neither
is a reason to exit: the host waits for the database, then fences itself — every worker
whose run claim may have passed to another host is stopped, and a new epoch is taken —
and serves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ..errors import DatabaseUnavailableError
from ..storage import StateStore

log = logging.getLogger("pi_workflows.host")

# How often a worker message waiting for the database looks whether it is back (the
# connection guard's own backoff decides how often a reconnect is really tried).
DATABASE_WAIT_POLL_S = 0.2
# How often a write that met a full disk is tried again.
DISK_FULL_RETRY_S = 0.5


def watch_connection(
    store: StateStore, heartbeat: Callable[[], None], reconcile: Callable[[], None]
) -> None:
    """As soon as a lost connection is back: beat once, so the lease is checked (and the
    workers' claims renewed) at once instead of a heartbeat period later; then
    `reconcile`: the connection may have dropped at a COMMIT, which then may or may not
    have happened, and what was to follow it was dropped either way."""
    guard = store.connection_guard
    if guard is None:
        return
    loop = asyncio.get_running_loop()

    def carry_on() -> None:
        loop.call_soon(heartbeat)
        loop.call_soon(reconcile)

    guard.on_reconnect = carry_on


async def wait_for_database(
    store: StateStore, is_stopping: Callable[[], bool], within_s: float | None = None
) -> bool:
    """Wait until the database answers again; False if the host stops first, if
    `within_s` passes, or if it cannot come back (a deleted SQLite file)."""
    guard = store.connection_guard
    loop = asyncio.get_running_loop()
    deadline = None if within_s is None else loop.time() + within_s
    while store.unavailable:
        if guard is None or is_stopping():
            return False
        if deadline is not None and loop.time() > deadline:
            return False
        await asyncio.sleep(DATABASE_WAIT_POLL_S)
        with contextlib.suppress(DatabaseUnavailableError):
            guard.ensure_connected()
    return not is_stopping()


async def wait_for_room(is_stopping: Callable[[], bool]) -> bool:
    """A write failed for lack of disk space (the store says so in the log): wait a
    pause before it is tried again; False if the host stops meanwhile."""
    await asyncio.sleep(DISK_FULL_RETRY_S)
    return not is_stopping()
