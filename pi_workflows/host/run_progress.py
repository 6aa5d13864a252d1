"""When one node is poisoning its run (SPEC §7.4): its workers keep dying in it.

What counts as progress in between is `storage.run_poison.progress_mark`.
"""

from __future__ import annotations

from ..storage.run_poison import latest_attempts, latest_workers

UNFINISHED_ATTEMPT_STATUSES = ("running", "interrupted")
WORKER_DEATHS = ("crashed", "timedOut")


def deaths_at_current_node(run_id: str, limit: int) -> tuple[str | None, int]:
    """The node the run's last worker died in, and how many workers in a row died there.

    Counts the run's latest attempts that never finished, all at one node, and the
    latest workers that crashed or timed out: both streaks must hold for a death to
    count, so a clean hand-off (host stop, pause) between two deaths breaks the chain.
    """
    attempts = latest_attempts(run_id, limit)
    if not attempts or attempts[0].status not in UNFINISHED_ATTEMPT_STATUSES:
        return None, 0
    node = attempts[0].node_id
    streak = 0
    for attempt in attempts:
        if attempt.node_id != node or attempt.status not in UNFINISHED_ATTEMPT_STATUSES:
            break
        streak += 1
    deaths = 0
    for worker in latest_workers(run_id, streak):
        if worker.status not in WORKER_DEATHS:
            break
        deaths += 1
    return node, deaths
