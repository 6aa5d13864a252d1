"""A kill point in the storage commit path, armed by an environment variable.

The crash-point explorer (:mod:`pi_workflows.testing.crash_points`) starts a host with
``PI_WORKFLOWS_TEST_KILL_POINT`` naming a JSON file; the host's state store then calls
:meth:`KillPoint.committing` right before and :meth:`KillPoint.committed` right after each
outermost transaction that changed a run (a *durable boundary*: every run change bumps the
run's revision, see ``storage/revisions.py``). The file says what to do:

- ``{"mode": "record"}``: append one line per boundary to ``<file>.boundaries``: its
  number, the run events its transaction wrote (the latest per run), the number of the last
  of them counting every run event this process wrote, and the pids of those runs' live
  workers;
- ``{"mode": "kill", "event": E, "when": "before"|"after", "target": "host"|"worker"}``:
  at the commit that writes this process's Eth run event, SIGKILL the host itself, or the
  live workers of the runs that transaction changed, right before or right after the
  commit. A boundary is named by its event rather than its commit number because the host
  may commit two writes in one transaction in one execution and in two in the next. It
  fires once: ``<file>.fired`` records that it did (and what it killed), so a host started
  after the kill runs unhindered.

Workers never commit themselves: the host commits each worker write in its own
transaction, so a worker killed "before" a boundary died with its write sent but not yet
durable, and one killed "after" died once it was, before it could go on.

Without the variable nothing of this module is imported by the host.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from ..storage.database import KILL_POINT_ENV


class KillPoint:
    """What one process does at its durable boundaries, as its spec file says."""

    def __init__(self, spec_path: Path) -> None:
        self.spec_path = spec_path
        spec = json.loads(spec_path.read_text())
        self.mode: str = spec["mode"]
        self.event: int = int(spec.get("event", 0))
        self.when: str = spec.get("when", "before")
        self.target: str = spec.get("target", "host")
        self.boundaries = 0
        self.events = 0
        self._pending: tuple[str, ...] = ()

    @property
    def boundaries_path(self) -> Path:
        return self.spec_path.with_name(self.spec_path.name + ".boundaries")

    @property
    def fired_path(self) -> Path:
        return self.spec_path.with_name(self.spec_path.name + ".fired")

    def committing(self, noted: Mapping[str, str], events: int) -> None:
        """Inside the transaction, right before its commit: `noted` maps each run it
        changed to its latest event type; `events` run events were written."""
        self._pending = ()
        if not noted:
            return
        self.boundaries += 1
        first, self.events = self.events + 1, self.events + events
        if self.mode == "record":
            entry = {
                "boundary": self.boundaries,
                "events": dict(noted),
                "lastEvent": self.events,
                "workers": _live_worker_pids(tuple(noted)),
            }
            with open(self.boundaries_path, "a") as log:
                log.write(json.dumps(entry) + "\n")
        elif first <= self.event <= self.events:
            self._pending = tuple(noted)
            if self.when == "before":
                self._fire(self._pending)

    def committed(self) -> None:
        """Right after the commit of the transaction `committing` saw last."""
        runs, self._pending = self._pending, ()
        if runs and self.when == "after":
            self._fire(runs)

    def _fire(self, runs: tuple[str, ...]) -> None:
        try:
            fd = os.open(self.fired_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return  # fired already, in this process or an earlier one
        pids = [os.getpid()] if self.target == "host" else _live_worker_pids(runs)
        with os.fdopen(fd, "w") as fired:
            json.dump({"target": self.target, "pids": pids, "runs": list(runs)}, fired)
            fired.flush()
            os.fsync(fired.fileno())
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue


def _live_worker_pids(runs: tuple[str, ...]) -> list[int]:
    from ..storage.models import ACTIVE_WORKER_STATUSES, RunWorker

    rows = RunWorker.select(RunWorker.pid).where(
        RunWorker.run.in_(list(runs))
        & RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
        & RunWorker.pid.is_null(False)
    )
    return [row.pid for row in rows if row.pid is not None]


def armed_kill_point() -> KillPoint | None:
    """The kill point `PI_WORKFLOWS_TEST_KILL_POINT` arms in this process, if any."""
    path = os.environ.get(KILL_POINT_ENV)
    return KillPoint(Path(path)) if path else None
