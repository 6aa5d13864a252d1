"""The host epoch lease in `host_state` (SPEC §5): one live host per database row."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ..canonical import sha256_hex
from ..clock import now_ms
from ..errors import ClaimLostError, HostAlreadyRunningError
from ..storage.models import HostState, Lease, RunWorker

HOST_LEASE_MS = 30_000
HOST_ROW_ID = 1


@dataclass(frozen=True)
class EpochLease:
    host_id: str
    token: str
    epoch: int
    pid: int
    process_start_identity: str


def previous_host() -> HostState:
    row, _ = HostState.get_or_create(id=HOST_ROW_ID, defaults={"epoch": 0})
    return row


def acquire_epoch(
    host_id: str,
    pid: int,
    identity: str,
    *,
    lease_ms: int = HOST_LEASE_MS,
    holder_is_dead: bool = False,
) -> EpochLease:
    """Take the next epoch by compare-and-set; refuse while another host's lease is live.

    `holder_is_dead` lets a host that holds the home's lock take over at once from a
    crashed predecessor on the same machine instead of waiting out its lease.
    """
    now = now_ms()
    current = previous_host()
    is_live = current.host_id is not None and current.expires_at and current.expires_at > now
    if is_live and not holder_is_dead:
        raise HostAlreadyRunningError(
            f"A live pi-workflows host (PID {current.pid}) already owns epoch {current.epoch}."
        )
    token = secrets.token_urlsafe(32)
    epoch = current.epoch + 1
    changed = (
        HostState.update(
            epoch=epoch,
            host_id=host_id,
            token_hash=sha256_hex(token),
            pid=pid,
            process_start_identity=identity,
            started_at=now,
            heartbeat_at=now,
            expires_at=now + lease_ms,
        )
        .where((HostState.id == HOST_ROW_ID) & (HostState.epoch == current.epoch))
        .execute()
    )
    if changed != 1:
        raise HostAlreadyRunningError("The pi-workflows host claim changed during startup.")
    return EpochLease(host_id, token, epoch, pid, identity)


def _own_row(lease: EpochLease):
    return (
        (HostState.id == HOST_ROW_ID)
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
        raise ClaimLostError("The pi-workflows host claim was lost.")


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
        )
        .where(_own_row(lease))
        .execute()
        == 1
    )


def recover_previous_host(previous_host_id: str | None, new_epoch: int) -> None:
    """Expire the dead host's run claims and orphan its workers (inside a transaction)."""
    now = now_ms()
    if previous_host_id:
        Lease.update(expires_at=now).where(
            (Lease.owner_id == previous_host_id) & (Lease.expires_at > now)
        ).execute()
    RunWorker.update(status="orphaned", finished_at=now).where(
        (RunWorker.host_epoch < new_epoch) & RunWorker.status.in_(("starting", "ready", "running"))
    ).execute()
