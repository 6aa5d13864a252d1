"""Which runs changed lifecycle status in a transaction, for `piw_run_transition`, and
which node attempts started or finished, for `piw_node_attempt_started`/`_finished`.

Every run change goes through `record_run_change` (or `create_run_row`), which notes the
run here. Right before the outermost transaction commits, `collect()` compares each
noted run's lifecycle status with the one last announced (`runs.announced_status`,
written in the same transaction), so the hook fires exactly once per real change, after
the commit, whichever code path made it: creation, claim, running, parking, waiting,
pause, resume, the end.

Node attempts are noted by `run_state` as it writes them; `collect()` keeps only those
whose row, read in the committing transaction (by the same read), still says so (a
savepoint that rolled back their write takes them back), so each is announced once,
after the commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..event_types import EventType
from ..records import NodeAttemptRecord
from . import statements
from .models import TERMINAL_RUN_STATUSES

_QUEUE_LIFECYCLE = {"queued": "queued", "starting": "claimed", "running": "running"}


@dataclass(frozen=True)
class RunTransition:
    run_id: str
    old_status: str | None
    new_status: str
    detail: str
    workflow_name: str
    at: int  # epoch ms of the commit


@dataclass(frozen=True)
class AttemptChange:
    """A node attempt that started or finished (``phase``) in this transaction."""

    phase: str  # "started" or "finished"
    attempt: NodeAttemptRecord  # workflow_name and attempt_number are filled in at collect


class _Noted(threading.local):
    def __init__(self) -> None:
        self.runs: dict[str, str] = {}  # run id -> event type of its latest change
        self.events = 0  # run events written (the test kit's kill point counts them)
        self.attempts: dict[tuple[str, str], AttemptChange] = {}  # by (attempt id, phase)


_noted = _Noted()


def lifecycle_status(run_status: str, queue_status: str, paused: bool) -> str:
    """One word for where a run is: queued, claimed, running, parked, waiting, paused,
    or its terminal status."""
    if run_status in TERMINAL_RUN_STATUSES:
        return run_status
    if paused:
        return "paused"
    if run_status == "waiting":
        return "waiting"
    return _QUEUE_LIFECYCLE.get(queue_status, "parked")


def note(run_id: str, event_type: EventType) -> None:
    _noted.runs[run_id] = event_type
    _noted.events += 1


def noted() -> tuple[dict[str, str], int]:
    """The runs this transaction changed so far (run id -> event type of its latest
    change), and how many run events it wrote."""
    return dict(_noted.runs), _noted.events


def note_attempt(phase: str, attempt: NodeAttemptRecord) -> None:
    _noted.attempts[(attempt.attempt_id, phase)] = AttemptChange(phase, attempt)


def forget() -> None:
    """A transaction begins or rolls back: nothing it noted may be announced."""
    _noted.runs, _noted.events, _noted.attempts = {}, 0, {}


def collect(
    now: int, heard: Callable[[], bool], blob_hashes: list[str]
) -> tuple[list[RunTransition], list[AttemptChange], dict[str, tuple[str, int, bytes]]]:
    """Inside the committing transaction, in one read: record and return the noted runs'
    changes; the noted attempt changes their rows still show, in the order they were
    noted, with their workflow name and attempt number; and the rows of `blob_hashes`
    (the blobs the transaction took up, to check: `blobs.check_read`). When `heard()`
    says no plugin listens to attempts, none is read and none returned."""
    noted, _noted.runs, _noted.events = _noted.runs, {}, 0
    noted_attempts, _noted.attempts = _noted.attempts, {}
    attempt_ids = sorted({attempt_id for attempt_id, _ in noted_attempts})
    if noted_attempts and not heard():
        attempt_ids = []
    found = statements.commit_rows(list(noted), attempt_ids, blob_hashes)
    return (
        _transitions(noted, found.runs, now),
        _attempt_changes(noted_attempts, found.attempts),
        found.blobs,
    )


def _transitions(
    noted: dict[str, str], rows: list[tuple[Any, ...]], now: int
) -> list[RunTransition]:
    if not noted:
        return []
    transitions = []
    announced_now: dict[str, str] = {}
    for (
        run_id,
        run_status,
        paused,
        detail,
        announced,
        queue_status,
        workflow_name,
    ) in rows:
        status = lifecycle_status(run_status, queue_status, bool(paused))
        if status == announced:
            continue
        announced_now[run_id] = status
        if announced is None and status != "queued":
            # Created and claimed by one commit (run.start on a host with a free worker):
            # the creation is a change of its own.
            transitions.append(
                RunTransition(run_id, None, "queued", EventType.RUN_CREATED, workflow_name, now)
            )
            announced = "queued"
        transitions.append(
            RunTransition(run_id, announced, status, detail or noted[run_id], workflow_name, now)
        )
    statements.set_announced_statuses(announced_now)
    return transitions


def _attempt_changes(
    noted: dict[tuple[str, str], AttemptChange], found: list[tuple[Any, ...]]
) -> list[AttemptChange]:
    rows = {
        attempt_id: (status, number, workflow_name)
        for attempt_id, status, number, workflow_name in found
    }
    changes = []
    for (attempt_id, phase), change in noted.items():
        row = rows.get(attempt_id)
        if row is None:
            continue  # the write that started it was rolled back
        status, number, workflow_name = row
        if phase == "finished" and status != change.attempt.outcome:
            continue  # the write that finished it was rolled back
        attempt = replace(change.attempt, workflow_name=workflow_name, attempt_number=number)
        changes.append(AttemptChange(phase, attempt))
    return changes
