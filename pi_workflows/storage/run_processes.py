"""Process groups a run started (SPEC §7.4a): registered, unregistered, left behind.

A row is `running` from registration until its worker unregisters it (`ended`) or the
host stops it (`killed`). Call these inside ``StateStore.transaction()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..clock import now_ms
from ..errors import InvalidInputError
from .models import ACTIVE_WORKER_STATUSES, RunProcess, RunWorker
from .prepared import Parameters, PreparedQuery

PROCESS_KINDS = ("shell", "agent")


@dataclass(frozen=True)
class RegisteredGroup:
    row_id: int
    run_id: str
    process_group: int
    start_identity: str


def register_group(
    run_id: str, worker_epoch: str, process_group: int, start_identity: str, machine: str, kind: str
) -> None:
    """Record a group the worker is about to let run (a repeat is a no-op)."""
    if kind not in PROCESS_KINDS:
        raise InvalidInputError(f"A process kind is one of {PROCESS_KINDS}, not {kind!r}.")
    RunProcess.insert(
        run=run_id,
        worker=worker_epoch,
        process_group=process_group,
        start_identity=start_identity,
        machine=machine,
        kind=kind,
        status="running",
        registered_at=now_ms(),
    ).on_conflict_ignore().execute()


def unregister_group(worker_epoch: str, process_group: int) -> None:
    """The worker saw the group's command end and cleaned up after it."""
    RunProcess.update(status="ended", ended_at=now_ms()).where(
        (RunProcess.worker == worker_epoch)
        & (RunProcess.process_group == process_group)
        & (RunProcess.status == "running")
    ).execute()


def _orphaned_groups(p: Parameters, *, of_run: bool) -> Any:
    live_workers = RunWorker.select(RunWorker.worker_epoch).where(
        RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
    )
    query = RunProcess.select(
        RunProcess.id, RunProcess.run, RunProcess.process_group, RunProcess.start_identity
    ).where(
        (RunProcess.status == "running")
        & (RunProcess.machine == p.machine)
        & RunProcess.worker.not_in(live_workers)
    )
    return query.where(RunProcess.run == p.run_id) if of_run else query


_ORPHANED_GROUPS = PreparedQuery(lambda p: _orphaned_groups(p, of_run=False))
_ORPHANED_GROUPS_OF_RUN = PreparedQuery(lambda p: _orphaned_groups(p, of_run=True))


def orphaned_groups(machine: str, run_id: str | None = None) -> list[RegisteredGroup]:
    """Registered groups on `machine` whose worker is no longer live (of one run, or all)."""
    if run_id is None:
        rows = _ORPHANED_GROUPS.rows(machine=machine)
    else:
        rows = _ORPHANED_GROUPS_OF_RUN.rows(machine=machine, run_id=run_id)
    return [RegisteredGroup(*row) for row in rows]


def mark_killed(row_ids: list[int]) -> None:
    if row_ids:
        RunProcess.update(status="killed", ended_at=now_ms()).where(
            RunProcess.id.in_(row_ids)
        ).execute()
