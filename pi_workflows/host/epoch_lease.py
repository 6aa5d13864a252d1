"""Host records and epoch leases in `host_state` (SPEC §5, §14).

Every home that runs a host on a database has one row: host id, epoch, machine, pid,
heartbeat and lease expiry. Epochs grow across all rows. On SQLite one live host is
allowed per database (single-host rules); on PostgreSQL any number of hosts share it,
and a host whose lease expired is taken over by the others.
"""

from __future__ import annotations

import secrets

from ..clock import now_ms
from ..errors import HostAlreadyRunningError, HostLeaseLostError
from ..home import machine_name
from ..storage import host_leases
from ..storage.host_leases import EpochLease

HOST_LEASE_MS = 15_000


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
    if not single_host:
        host_leases.lock_epoch_allocation()
    now = now_ms()
    current = host_leases.previous_host(key)
    if current is not None and host_leases.is_live(current, now) and not holder_is_dead:
        raise HostAlreadyRunningError(
            f"A live pi-workflows host (PID {current.pid}) already owns epoch {current.epoch}."
        )
    if single_host:
        others = [
            row for row in host_leases.live_hosts() if current is None or row.id != current.id
        ]
        if others:
            raise HostAlreadyRunningError(
                f"A pi-workflows host on {others[0].machine} (PID {others[0].pid}) uses this "
                "SQLite database; several hosts need PostgreSQL (--database postgresql://…)."
            )
    epoch = host_leases.newest_epoch() + 1
    token = secrets.token_urlsafe(32)
    row_id = host_leases.write_lease(
        current,
        key,
        epoch=epoch,
        machine=machine_name(),
        socket_address=socket_address,
        host_id=host_id,
        token=token,
        pid=pid,
        identity=identity,
        now=now,
        expires_at=now + lease_ms,
    )
    if row_id is None:
        raise HostAlreadyRunningError("The pi-workflows host claim changed during startup.")
    return EpochLease(host_id, token, epoch, pid, identity, row_id)


def renew_epoch(lease: EpochLease, lease_ms: int = HOST_LEASE_MS) -> None:
    now = now_ms()
    if not host_leases.renew_lease(lease, now, now + lease_ms):
        raise HostLeaseLostError("The pi-workflows host claim was lost.")


def fence(lease: EpochLease, *, later: bool = False) -> None:
    """Refuse the current transaction unless this host's lease is live (PostgreSQL).

    The host row is held until commit, so a takeover of this host waits for the
    transaction, and a transaction after a takeover is refused: a host whose lease
    expired writes nothing. With `later`, the check travels with the transaction's first
    statement, which raises `HostLeaseLostError` (and so does the rest of the
    transaction): for a transaction whose code does nothing outside the database before
    its first statement that matters (a group commit's), one round trip fewer.
    """
    if later and host_leases.hold_live_lease_check(lease, now_ms(), _lease_lost):
        return
    if not host_leases.share_live_lease(lease, now_ms()):
        raise _lease_lost()


def _lease_lost() -> HostLeaseLostError:
    return HostLeaseLostError("This host's lease expired; it writes nothing more and stops.")


def is_duty_host(lease: EpochLease) -> bool:
    """True for the oldest live host: it alone runs the database-wide duties."""
    hosts = host_leases.live_hosts()
    return bool(hosts) and hosts[0].id == lease.row_id and hosts[0].epoch == lease.epoch


def recover_previous_host(previous_host_id: str | None) -> None:
    """Expire the dead host's run claims and orphan workers of hosts no longer live.

    Runs inside the startup transaction, after this host took its epoch.
    """
    now = now_ms()
    if previous_host_id:
        host_leases.expire_claims_of(previous_host_id, now)
    live_epochs = [row.epoch for row in host_leases.live_hosts()]
    host_leases.orphan_workers_outside(live_epochs, now)


def take_over_expired_hosts(lease: EpochLease) -> list[int]:
    """Fence out hosts whose lease expired and free their runs (inside a transaction).

    Each dead row is cleared by compare-and-set on its epoch, so exactly one host takes
    it over; the dead host's run claims expire now and its workers count as orphaned, so
    the next claim pass resumes the runs at their last durable boundary. Returns the
    epochs taken over.
    """
    now = now_ms()
    taken: list[int] = []
    for row in host_leases.expired_hosts(lease.row_id, now):
        if not host_leases.release_expired(row, now):
            continue
        assert row.host_id is not None  # an expired row still names its host
        host_leases.expire_claims_of(row.host_id, now)
        host_leases.orphan_workers_of(row.epoch, now)
        taken.append(row.epoch)
    return taken
