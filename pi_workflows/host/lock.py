"""The single-instance lock file `<home>/host/host.lock.json` (SPEC §5)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..canonical import canonical_json
from ..errors import HostAlreadyRunningError
from .process_identity import is_running, start_identity

LOCK_SCHEMA = "pi-workflows.host-lock.v1"


@dataclass(frozen=True)
class HostLock:
    path: Path
    host_id: str

    def is_held(self) -> bool:
        """The lock file still names this host (not removed with its home, nor replaced)."""
        record = read_lock(self.path)
        return record is not None and record.get("hostId") == self.host_id

    def release(self) -> None:
        """Remove the lock only if it is still ours."""
        record = read_lock(self.path)
        if record is not None and record.get("hostId") == self.host_id:
            self.path.unlink(missing_ok=True)


def read_lock(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if (
        isinstance(record, dict)
        and record.get("schema") == LOCK_SCHEMA
        and isinstance(record.get("pid"), int)
        and isinstance(record.get("startIdentity"), str)
        and isinstance(record.get("hostId"), str)
    ):
        return record
    return None


def live_lock_holder(path: Path) -> dict | None:
    """The lock record when its process is still the one that wrote it.

    A killed host nobody has reaped yet (a zombie) keeps its pid and start time but
    serves nothing, so it holds no lock.
    """
    record = read_lock(path)
    if record and is_running(record["pid"], record["startIdentity"]):
        return record
    return None


def acquire_host_lock(path: Path, host_id: str) -> HostLock:
    """Take the lock, replacing a stale one; refuse while a live host holds it."""
    identity = start_identity(os.getpid())
    if identity is None:
        raise HostAlreadyRunningError("Cannot attest the workflow host process start identity.")
    holder = live_lock_holder(path)
    if holder is not None:
        raise HostAlreadyRunningError(
            f"A workflow host is already running with PID {holder['pid']}; use "
            "'pi-workflows host stop' to stop it."
        )
    path.unlink(missing_ok=True)
    record = {
        "schema": LOCK_SCHEMA,
        "pid": os.getpid(),
        "startIdentity": identity,
        "hostId": host_id,
    }
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        holder = live_lock_holder(path)
        pid = holder["pid"] if holder else "unknown"
        raise HostAlreadyRunningError(
            f"A workflow host is already running with PID {pid}; use 'pi-workflows host stop'."
        ) from None
    with os.fdopen(fd, "w") as handle:
        handle.write(canonical_json(record) + "\n")
    return HostLock(path, host_id)
