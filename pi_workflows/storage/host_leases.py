"""The `host_state` rows and the host leases they record (SPEC §5, §14), and what the end
of a host's lease does to its run claims and workers. Call these inside
``StateStore.transaction()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import peewee

from ..canonical import sha256_hex
from ..clock import now_ms
from . import statements
from .deferred_statements import HeldCheck
from .driver import run_sql, sqlstate
from .models import ACTIVE_WORKER_STATUSES, HostState, Lease, RunWorker, database_proxy
from .prepared import Parameters, PreparedQuery

# Serialises epoch allocation between hosts starting at once on PostgreSQL.
_EPOCH_LOCK_KEY = 0x7069_7766  # "piwf"
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock wait past lock_timeout


@dataclass(frozen=True)
class EpochLease:
    """The lease a host holds on its home's row: the row, its epoch and the secret token."""

    host_id: str
    token: str
    epoch: int
    pid: int
    process_start_identity: str
    row_id: int


def is_live(row: HostState, now: int) -> bool:
    """A host holds the row and its lease has not run out at `now`."""
    return row.host_id is not None and row.expires_at is not None and row.expires_at > now


def previous_host(key: str) -> HostState | None:
    """The record of the last host of this home on this database, if any."""
    return HostState.get_or_none(HostState.home_key == key)


# The statements below run at every poll of a host on a shared database, or in every one
# of its transactions (the fence): prepared, because building them cost more than running
# them.
_LIVE_HOSTS = PreparedQuery(
    lambda p: (
        HostState.select()
        .where(HostState.host_id.is_null(False) & (HostState.expires_at > p.now))
        .order_by(HostState.epoch)
    )
)


def live_hosts() -> list[HostState]:
    """The rows of every host whose lease has not run out, oldest epoch first."""
    return _LIVE_HOSTS.models(HostState, now=now_ms())


def lock_epoch_allocation() -> None:
    """PostgreSQL: wait for other hosts taking an epoch, until this transaction ends."""
    HostState._meta.database.execute_sql("SELECT pg_advisory_xact_lock(%s)", (_EPOCH_LOCK_KEY,))


def newest_epoch() -> int:
    """The highest epoch any host of this database took; 0 before the first."""
    newest = HostState.select(HostState.epoch).order_by(HostState.epoch.desc()).first()
    return newest.epoch if newest else 0


def write_lease(
    current: HostState | None,
    key: str,
    *,
    epoch: int,
    machine: str,
    socket_address: str,
    host_id: str,
    token: str,
    pid: int,
    identity: str,
    now: int,
    expires_at: int,
) -> int | None:
    """This home's row with a new lease: the row id; None when `current` changed meanwhile."""
    values: dict[str, Any] = {
        "epoch": epoch,
        "machine": machine,
        "socket_address": socket_address,
        "host_id": host_id,
        "token_hash": sha256_hex(token),
        "pid": pid,
        "process_start_identity": identity,
        "started_at": now,
        "heartbeat_at": now,
        "expires_at": expires_at,
        "released_at": None,
    }
    if current is None:
        row_id: int = HostState.insert(home_key=key, **values).execute()
        return row_id
    changed: int = (
        HostState.update(**values)
        .where((HostState.id == current.id) & (HostState.epoch == current.epoch))
        .execute()
    )
    return current.id if changed == 1 else None


def _own_row(p: Parameters) -> Any:
    """The host's own row: its id, epoch, host and token (as `_own_arguments` gives them)."""
    return (
        (HostState.id == p.row_id)
        & (HostState.epoch == p.epoch)
        & (HostState.host_id == p.host_id)
        & (HostState.token_hash == p.token_hash)
    )


def _own_arguments(lease: EpochLease) -> dict[str, Any]:
    return {
        "row_id": lease.row_id,
        "epoch": lease.epoch,
        "host_id": lease.host_id,
        "token_hash": sha256_hex(lease.token),
    }


def _released(now: Any) -> dict[str, Any]:
    """A row's lease cleared; its epoch and last heartbeat stay."""
    return {
        "host_id": None,
        "token_hash": None,
        "pid": None,
        "process_start_identity": None,
        "started_at": None,
        "expires_at": None,
        "released_at": now,
    }


def _own_live(p: Parameters) -> Any:
    """The host's own row while its lease is live at `p.now`."""
    return _own_row(p) & (HostState.expires_at > p.now)


_RENEW_LEASE = PreparedQuery(
    lambda p: HostState.update(heartbeat_at=p.now, expires_at=p.expires_at).where(_own_live(p)),
    planned=True,
)


def renew_lease(lease: EpochLease, now: int, expires_at: int) -> bool:
    """Extend the host's live lease to `expires_at`; False when it is no longer held."""
    return _RENEW_LEASE.changed(**_own_arguments(lease), now=now, expires_at=expires_at) == 1


def _held_own_live(p: Parameters) -> Any:
    # `FOR SHARE`: a takeover of this host waits for the transaction, and a transaction
    # after a takeover finds no row.
    query = HostState.select(HostState.id).where(_own_live(p))
    return query.for_update("FOR SHARE")  # type: ignore[arg-type]  # peewee takes the clause text


_SHARE_LIVE_LEASE = PreparedQuery(_held_own_live, planned=True)


def share_live_lease(lease: EpochLease, now: int) -> bool:
    """Hold the host's row until commit if its lease is live at `now`; False when it is not."""
    return _SHARE_LIVE_LEASE.exists(**_own_arguments(lease), now=now)


# `share_live_lease` as a check: the count of live rows is 1, or 0 and the division fails.
_CHECK_LIVE_LEASE = (
    "SELECT 1 / (SELECT count(*)::int FROM (SELECT 1 FROM host_state WHERE id = ?"
    " AND epoch = ? AND host_id = ? AND token_hash = ? AND expires_at > ? FOR SHARE)"
    " AS live)"
)


def hold_live_lease_check(lease: EpochLease, now: int, failure: Callable[[], Exception]) -> bool:
    """PostgreSQL, inside a transaction: `share_live_lease` as a check that travels with
    the transaction's next statement (`DeferredStatements.hold_check`), which raises
    `failure()` when the lease is not live at `now`. False where it cannot travel: the
    caller checks with `share_live_lease`."""
    own = _own_arguments(lease)
    params = (own["row_id"], own["epoch"], own["host_id"], own["token_hash"], now)
    return statements.hold_check(_CHECK_LIVE_LEASE, params, HeldCheck(failure))


_RELEASE_EPOCH = PreparedQuery(
    lambda p: HostState.update(**_released(p.now)).where(_own_row(p)), planned=True
)


def release_epoch(lease: EpochLease) -> bool:
    """Give up the lease; the epoch and the last heartbeat stay for the next host."""
    return _RELEASE_EPOCH.changed(**_own_arguments(lease), now=now_ms()) == 1


_EXPIRED_HOSTS = PreparedQuery(
    lambda p: HostState.select().where(
        HostState.host_id.is_null(False)
        & (HostState.expires_at <= p.now)
        & (HostState.id != p.own_row_id)
    )
)


def wait_for_locks_at_most(ms: int) -> None:
    """PostgreSQL, for the rest of this transaction: a statement that waits for a row lock
    longer than `ms` fails (`is_lock_wait_over`) instead of waiting on. SQLite takes its
    one write lock at BEGIN."""
    db = database_proxy.obj
    if isinstance(db, peewee.PostgresqlDatabase):
        run_sql(db, f"SET LOCAL lock_timeout = {int(ms)}", ())


def is_lock_wait_over(error: BaseException) -> bool:
    """The error of a statement that waited for a row lock past `wait_for_locks_at_most`."""
    return sqlstate(error) == LOCK_NOT_AVAILABLE


def expired_hosts(own_row_id: int, now: int) -> list[HostState]:
    """The rows of other hosts that still hold a lease which ran out by `now`."""
    return _EXPIRED_HOSTS.models(HostState, own_row_id=own_row_id, now=now)


def release_expired(row: HostState, now: int) -> bool:
    """Clear an expired lease, compare-and-set on its epoch; False if another host did."""
    changed: int = (
        HostState.update(**_released(now))
        .where(
            (HostState.id == row.id)
            & (HostState.epoch == row.epoch)
            & (HostState.expires_at <= now)
        )
        .execute()
    )
    return changed == 1


def expire_claims_of(host_id: str, now: int) -> None:
    """The run claims that host holds expire at `now`."""
    Lease.update(expires_at=now).where(
        (Lease.owner_id == host_id) & (Lease.expires_at > now)
    ).execute()


def orphan_workers_of(host_epoch: int, now: int) -> None:
    """The live workers of that host epoch count as orphaned from `now`."""
    RunWorker.update(status="orphaned", finished_at=now).where(
        (RunWorker.host_epoch == host_epoch) & RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
    ).execute()


def orphan_workers_outside(live_epochs: list[int], now: int) -> None:
    """The live workers of every host epoch but `live_epochs` count as orphaned from `now`."""
    RunWorker.update(status="orphaned", finished_at=now).where(
        RunWorker.host_epoch.not_in(live_epochs) & RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
    ).execute()


def workers_left_running(host_epoch: int | None) -> list[RunWorker]:
    """The live workers with a pid: of the host of `host_epoch`, or of every host (None)."""
    rows = RunWorker.select(RunWorker.pid, RunWorker.process_start_identity).where(
        RunWorker.status.in_(ACTIVE_WORKER_STATUSES) & RunWorker.pid.is_null(False)
    )
    if host_epoch is not None:
        rows = rows.where(RunWorker.host_epoch == host_epoch)
    return list(rows)
