"""Host records and epoch leases in `host_state` (SPEC §5, §14).

Every home that runs a host on a database has one row: host id, epoch, machine, pid,
heartbeat and lease expiry. Epochs grow across all rows. On SQLite one live host is
allowed per database (single-host rules); on PostgreSQL any number of hosts share it,
and a host whose lease expired is taken over by the others.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from ..canonical import sha256_hex
from ..clock import now_ms
from ..errors import HostAlreadyRunningError, HostLeaseLostError
from ..home import machine_name
from ..storage.models import ACTIVE_WORKER_STATUSES, HostState, Lease, RunWorker

HOST_LEASE_MS = 15_000
# Serialises epoch allocation between hosts starting at once on PostgreSQL.
_EPOCH_LOCK_KEY = 0x7069_7766  # "piwf"


@dataclass(frozen=True)
class EpochLease:
    host_id: str
    token: str
    epoch: int
    pid: int
    process_start_identity: str
    row_id: int


def is_live(row: HostState, now: int) -> bool:
    return row.host_id is not None and row.expires_at is not None and row.expires_at > now


def previous_host(key: str) -> HostState | None:
    """The record of the last host of this home on this database, if any."""
    return HostState.get_or_none(HostState.home_key == key)


def live_hosts() -> list[HostState]:
    now = now_ms()
    return list(
        HostState.select()
        .where(HostState.host_id.is_null(False) & (HostState.expires_at > now))
        .order_by(HostState.epoch)
    )


def acquire_epoch(
    host_id: str,
    pid: int,
    identity: str,
    *,
    key: str,
    socket_address: str,
    single_host: bool,
    lease_ms: int = HOST_LEASE_MS,
    holder_is_dead: bool = False,
) -> EpochLease:
    """Take the next epoch for this home's row (inside the caller's transaction).

    Refuses while this home's previous host is live, unless `holder_is_dead` (a crashed
    predecessor on this machine: take over at once instead of waiting out its lease).
    With `single_host` (SQLite) any other live host refuses too.
    """
    database = HostState._meta.database
    if not single_host:
        database.execute_sql("SELECT pg_advisory_xact_lock(%s)", (_EPOCH_LOCK_KEY,))
    now = now_ms()
    current = previous_host(key)
    if current is not None and is_live(current, now) and not holder_is_dead:
        raise HostAlreadyRunningError(
            f"A live pi-workflows host (PID {current.pid}) already owns epoch {current.epoch}."
        )
    if single_host:
        others = [row for row in live_hosts() if current is None or row.id != current.id]
        if others:
            raise HostAlreadyRunningError(
                f"A pi-workflows host on {others[0].machine} (PID {others[0].pid}) uses this "
                "SQLite database; several hosts need PostgreSQL (--database postgresql://…)."
            )
    newest = HostState.select(HostState.epoch).order_by(HostState.epoch.desc()).first()
    epoch = (newest.epoch if newest else 0) + 1
    token = secrets.token_urlsafe(32)
    values: dict[str, Any] = {
        "epoch": epoch,
        "machine": machine_name(),
        "socket_address": socket_address,
        "host_id": host_id,
        "token_hash": sha256_hex(token),
        "pid": pid,
        "process_start_identity": identity,
        "started_at": now,
        "heartbeat_at": now,
        "expires_at": now + lease_ms,
        "released_at": None,
    }
    if current is None:
        row_id = HostState.insert(home_key=key, **values).execute()
    else:
        changed = (
            HostState.update(**values)
            .where((HostState.id == current.id) & (HostState.epoch == current.epoch))
            .execute()
        )
        if changed != 1:
            raise HostAlreadyRunningError("The pi-workflows host claim changed during startup.")
        row_id = current.id
    return EpochLease(host_id, token, epoch, pid, identity, row_id)


def _own_row(lease: EpochLease) -> Any:
    return (
        (HostState.id == lease.row_id)
        & (HostState.epoch == lease.epoch)
        & (HostState.host_id == lease.host_id)
        & (HostState.token_hash == sha256_hex(lease.token))
    )


def renew_epoch(lease: EpochLease, lease_ms: int = HOST_LEASE_MS) -> None:
    now = now_ms()
    changed = (
        HostState.update(heartbeat_at=now, expires_at=now + lease_ms)
        .where(_own_row(lease) & (HostState.expires_at > now))
        .execute()
    )
    if changed != 1:
        raise HostLeaseLostError("The pi-workflows host claim was lost.")


def fence(lease: EpochLease) -> None:
    """Refuse the current transaction unless this host's lease is live (PostgreSQL).

    `FOR SHARE` holds the host row until commit, so a takeover of this host waits for the
    transaction, and a transaction after a takeover finds no row: a host whose lease
    expired writes nothing.
    """
    row = (
        HostState.select(HostState.id)
        .where(_own_row(lease) & (HostState.expires_at > now_ms()))
        .for_update("FOR SHARE")  # type: ignore[arg-type]  # peewee takes the clause text
        .first()
    )
    if row is None:
        raise HostLeaseLostError("This host's lease expired; it writes nothing more and stops.")


def is_duty_host(lease: EpochLease) -> bool:
    """True for the oldest live host: it alone runs the database-wide duties."""
    hosts = live_hosts()
    return bool(hosts) and hosts[0].id == lease.row_id and hosts[0].epoch == lease.epoch


def release_epoch(lease: EpochLease) -> bool:
    """Give up the lease; the epoch and the last heartbeat stay for the next host."""
    return (
        HostState.update(
            host_id=None,
            token_hash=None,
            pid=None,
            process_start_identity=None,
            started_at=None,
            expires_at=None,
            released_at=now_ms(),
        )
        .where(_own_row(lease))
        .execute()
        == 1
    )


def recover_previous_host(previous_host_id: str | None) -> None:
    """Expire the dead host's run claims and orphan workers of hosts no longer live.

    Runs inside the startup transaction, after this host took its epoch.
    """
    now = now_ms()
    if previous_host_id:
        Lease.update(expires_at=now).where(
            (Lease.owner_id == previous_host_id) & (Lease.expires_at > now)
        ).execute()
    live_epochs = [row.epoch for row in live_hosts()]
    RunWorker.update(status="orphaned", finished_at=now).where(
        RunWorker.host_epoch.not_in(live_epochs) & RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
    ).execute()


def take_over_expired_hosts(lease: EpochLease) -> list[int]:
    """Fence out hosts whose lease expired and free their runs (inside a transaction).

    Each dead row is cleared by compare-and-set on its epoch, so exactly one host takes
    it over; the dead host's run claims expire now and its workers count as orphaned, so
    the next claim pass resumes the runs at their last durable boundary. Returns the
    epochs taken over.
    """
    now = now_ms()
    expired = HostState.select().where(
        HostState.host_id.is_null(False)
        & (HostState.expires_at <= now)
        & (HostState.id != lease.row_id)
    )
    taken: list[int] = []
    for row in expired:
        changed = (
            HostState.update(
                host_id=None,
                token_hash=None,
                pid=None,
                process_start_identity=None,
                started_at=None,
                expires_at=None,
                released_at=now,
            )
            .where(
                (HostState.id == row.id)
                & (HostState.epoch == row.epoch)
                & (HostState.expires_at <= now)
            )
            .execute()
        )
        if changed != 1:
            continue
        Lease.update(expires_at=now).where(
            (Lease.owner_id == row.host_id) & (Lease.expires_at > now)
        ).execute()
        RunWorker.update(status="orphaned", finished_at=now).where(
            (RunWorker.host_epoch == row.epoch) & RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
        ).execute()
        taken.append(row.epoch)
    return taken
