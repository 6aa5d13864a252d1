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
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import DatabaseUnavailableError, PiWorkflowsError
from ..home import home_key, machine_name
from ..storage import StateStore
from . import epoch_lease
from .process_identity import start_identity

if TYPE_CHECKING:
    from .runtime import Host

log = logging.getLogger("pi_workflows.host")

# How often a worker message waiting for the database looks whether it is back (the
# connection guard's own backoff decides how often a reconnect is really tried).
DATABASE_WAIT_POLL_S = 0.2
# How often a write that met a full disk is tried again.
DISK_FULL_RETRY_S = 0.5


def watch_connection(store: StateStore, heartbeat: Callable[[], None]) -> None:
    """Beat once as soon as a lost connection is back: the lease is checked (and the
    workers' claims renewed) at once instead of a heartbeat period later."""
    guard = store.connection_guard
    if guard is None:
        return
    loop = asyncio.get_running_loop()

    def wake_heartbeat() -> None:
        loop.call_soon(heartbeat)

    guard.on_reconnect = wake_heartbeat


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


def retake_lease(host: Host) -> bool:
    """Fence the host after its lease expired and take a new epoch; False to stop.

    Every worker is stopped first: its run's claim expired with the lease, so another
    host may run the run now (the workers' own writes are refused by their claims
    anyway). The host's row is taken again only when it is still this host's or free;
    on SQLite another live host of the database refuses it, as at startup.
    """
    for active in list(host.slots.active_runs.values()):
        active.claim_lost = True
        active.stop("claimLost")
    host.slots.pending_claims.clear()  # their activations find them gone and launch nothing
    store, key = host.store, home_key(host.home)
    fence, store.fence = store.fence, None  # the old lease cannot pass its own fence
    acquiring = host.lease_clock.renewal_starts()
    try:
        with store.transaction():
            current = epoch_lease.previous_host(key)
            lease = epoch_lease.acquire_epoch(
                host.host_id,
                os.getpid(),
                start_identity(os.getpid()) or "",
                key=key,
                socket_address=f"{machine_name()}:{host.home.socket_path}",
                single_host=store.is_sqlite,
                lease_ms=host.timings.host_lease_ms,
                holder_is_dead=current is None or current.host_id in (None, host.host_id),
            )
            epoch_lease.recover_previous_host(host.host_id)
    except PiWorkflowsError as error:
        log.error("could not take the host lease again, stopping: %s", error)
        return False
    finally:
        store.fence = fence
    host.epoch_lease = lease
    host.lease_clock.renewed(acquiring)
    # The workers it records and claims it takes from now on are this epoch's.
    host.slots.epoch = host.workers.epoch = lease.epoch
    if not store.is_sqlite:
        with contextlib.suppress(PiWorkflowsError):
            host.is_duty_host = epoch_lease.is_duty_host(lease)
    log.warning("took the host lease again at epoch %d; its workers were stopped", lease.epoch)
    return True
