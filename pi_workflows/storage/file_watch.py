"""A SQLite state file deleted or replaced under a running process, and a home whose
state database went missing between two hosts.

SQLite keeps writing into a file that was unlinked (`rm state.sqlite*`): every run
"completes" into a file nobody will read again, and the next host starts empty. So the
store remembers the file's identity (device and inode) when it opens it and checks it
before each transaction; once the file is gone or another one stands in its place, the
store refuses every write with one sentence that says what happened and what to do.

And the home records (`host/state-databases.json`) every SQLite database created for
it: a database that existed and is gone is refused at open instead of silently created
afresh.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from ..clock import now_ms
from ..errors import DatabaseUnavailableError, NotFoundError
from ..home import Home

MARKER_NAME = "state-databases.json"

log = logging.getLogger("pi_workflows.storage")


class SqliteFileWatch:
    """The identity of one open SQLite file, checked before every transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity = _identity(path)
        #: why the file can no longer be written ('' while it can).
        self.gone = ""

    def check(self) -> None:
        """Refuse (and keep refusing) once the file was deleted or replaced."""
        if not self.gone and _identity(self.path) != self._identity:
            self.gone = (
                f"The state database {self.path} was deleted or replaced while this process "
                "had it open; nothing more is written to it. Stop the host ('pi-workflows "
                "host stop') and restore the file from a backup (the runs since that backup "
                "are lost)."
            )
            log.error("%s", self.gone)
        if self.gone:
            raise DatabaseUnavailableError(self.gone)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def _marker(home: Home) -> Path:
    return home.host_dir / MARKER_NAME


def _recorded(home: Home) -> dict[str, int]:
    try:
        recorded = json.loads(_marker(home).read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def refuse_missing(home: Home, path: Path) -> None:
    """Refuse to create `path` afresh when this home recorded a database there."""
    created_at = _recorded(home).get(str(path))
    if created_at is None or path.exists():
        return
    raise NotFoundError(
        f"The state database {path} is gone, but this home had one there; restore it from a "
        f"backup, or start with empty state by removing {_marker(home)} (its runs are lost)."
    )


def record_database(home: Home, path: Path) -> None:
    """Note in the home that a state database exists at `path` (once)."""
    recorded = _recorded(home)
    if str(path) in recorded:
        return
    recorded[str(path)] = now_ms()
    marker = _marker(home)
    scratch = marker.with_suffix(".tmp")
    with contextlib.suppress(OSError):  # a read-only home: the marker is a safeguard only
        fd = os.open(scratch, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(recorded, handle)
        os.replace(scratch, marker)
