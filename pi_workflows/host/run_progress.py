"""What counts as workflow progress, and when one node is poisoning its run (SPEC §7.4).

Progress is a committed node result or a lifecycle transition of the run. Bookkeeping a
worker writes on every launch (`run.relaunched`, `node.started`, an attempt marked
`interrupted`) bumps the run revision too, so the revision cannot be the measure: a node
that kills its worker would then be relaunched forever.
"""

from __future__ import annotations

from dataclasses import dataclass

from peewee import SQL, fn

from ..storage.models import NodeAttempt, Run, RunWorker
from ..storage.prepared import PreparedQuery

FINISHED_ATTEMPT_STATUSES = ("completed", "failed", "timed_out", "cancelled")
UNFINISHED_ATTEMPT_STATUSES = ("running", "interrupted")
WORKER_DEATHS = ("crashed", "timedOut")


@dataclass(frozen=True)
class ProgressMark:
    finished_attempts: int
    run_status: str


_PROGRESS = PreparedQuery(
    lambda p: Run.select(
        Run.status,
        NodeAttempt.select(fn.COUNT(SQL("*"))).where(
            (NodeAttempt.run == p.run_id) & NodeAttempt.status.in_(FINISHED_ATTEMPT_STATUSES)
        ),
    ).where(Run.run_id == p.run_id)
)


def progress_mark(run_id: str) -> ProgressMark:
    """The run's progress so far; equal marks mean nothing was achieved in between."""
    row = _PROGRESS.first(run_id=run_id)
    status, finished = row if row is not None else (None, 0)
    return ProgressMark(finished, status)


def deaths_at_current_node(run_id: str, limit: int) -> tuple[str | None, int]:
    """The node the run's last worker died in, and how many workers in a row died there.

    Counts the run's latest attempts that never finished, all at one node, and the
    latest workers that crashed or timed out: both streaks must hold for a death to
    count, so a clean hand-off (host stop, pause) between two deaths breaks the chain.
    """
    attempts = list(
        NodeAttempt.select(NodeAttempt.node_id, NodeAttempt.status)
        .where(NodeAttempt.run == run_id)
        .order_by(NodeAttempt.started_at.desc(), NodeAttempt.attempt_number.desc())
        .limit(limit)
    )
    if not attempts or attempts[0].status not in UNFINISHED_ATTEMPT_STATUSES:
        return None, 0
    node = attempts[0].node_id
    streak = 0
    for attempt in attempts:
        if attempt.node_id != node or attempt.status not in UNFINISHED_ATTEMPT_STATUSES:
            break
        streak += 1
    deaths = 0
    for worker in (
        RunWorker.select(RunWorker.status)
        .where(RunWorker.run == run_id)
        .order_by(RunWorker.started_at.desc(), RunWorker.generation.desc())
        .limit(streak)
    ):
        if worker.status not in WORKER_DEATHS:
            break
        deaths += 1
    return node, deaths
