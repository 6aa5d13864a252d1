"""What tells whether a run is moving on or one node keeps killing its workers (SPEC §7.4).

Progress is a committed node result or a lifecycle transition of the run. Bookkeeping a
worker writes on every launch (`run.relaunched`, `node.started`, an attempt marked
`interrupted`) bumps the run revision too, so the revision cannot be the measure: a node
that kills its worker would then be relaunched forever.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

import peewee
from peewee import SQL, fn

from ..errors import NotFoundError
from .models import NodeAttempt, Run, RunWorker
from .prepared import Parameters, PreparedQuery
from .revisions import claimed_unchanged

FINISHED_ATTEMPT_STATUSES = ("completed", "failed", "timed_out", "cancelled")


@dataclass(frozen=True)
class ProgressMark:
    finished_attempts: int
    run_status: str


def finished_attempts(p: Parameters) -> peewee.SelectQuery:
    """How many of the run's node attempts finished (a subquery by `p.run_id`)."""
    return NodeAttempt.select(fn.COUNT(SQL("*"))).where(
        (NodeAttempt.run == p.run_id) & NodeAttempt.status.in_(FINISHED_ATTEMPT_STATUSES)
    )


_PROGRESS = PreparedQuery(
    lambda p: Run.select(Run.status, finished_attempts(p)).where(Run.run_id == p.run_id)
)
# A new worker's run, in one read: its launch envelope's fields (in `NewRun`'s order),
# its revision, then its progress.
LAUNCH_FIELDS = ("project_path", "workflow_source", "definition_digest", "input_hash")
_LAUNCH_READ = PreparedQuery(
    lambda p: Run.select(
        *(getattr(Run, name) for name in LAUNCH_FIELDS),
        Run.revision,
        Run.status,
        finished_attempts(p),
    ).where(Run.run_id == p.run_id),
    planned=True,
)


def progress_mark(run_id: str) -> ProgressMark:
    """The run's progress so far; equal marks mean nothing was achieved in between."""
    row = _PROGRESS.first(run_id=run_id)
    status, finished = row if row is not None else (None, 0)
    return ProgressMark(finished, status)


def launch_read(run_id: str) -> tuple[tuple[str, str, str, str, int], ProgressMark]:
    """What a new worker of the run is launched with: the run's project path, workflow
    source (as stored), definition digest, input hash and revision; and its progress
    mark (`progress_mark`), which the worker's exit is measured against. Of a run this
    transaction claimed (`claimed_unchanged`), without a read."""
    claimed = claimed_unchanged(run_id)
    if claimed is not None:
        run, (finished, status), revision, _ = claimed
        return (*astuple(run), revision), ProgressMark(finished, status)
    row = _LAUNCH_READ.first(run_id=run_id)
    if row is None:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    project_path, workflow_source, definition_digest, input_hash, revision, status, finished = row
    return (
        (project_path, workflow_source, definition_digest, input_hash, revision),
        ProgressMark(finished, status),
    )


def latest_attempts(run_id: str, limit: int) -> list[NodeAttempt]:
    """The node and status of the run's `limit` latest node attempts, newest first."""
    return list(
        NodeAttempt.select(NodeAttempt.node_id, NodeAttempt.status)
        .where(NodeAttempt.run == run_id)
        .order_by(NodeAttempt.started_at.desc(), NodeAttempt.attempt_number.desc())
        .limit(limit)
    )


def latest_workers(run_id: str, limit: int) -> list[RunWorker]:
    """The status of the run's `limit` latest workers, newest first."""
    return list(
        RunWorker.select(RunWorker.status)
        .where(RunWorker.run == run_id)
        .order_by(RunWorker.started_at.desc(), RunWorker.generation.desc())
        .limit(limit)
    )
