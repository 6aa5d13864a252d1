"""What the client's run operations (SPEC §8) read and write beyond `runs`, `run_claims`
and `run_rows`: the queue row of a run paused without a worker. Call these inside
``StateStore.transaction()``.
"""

from __future__ import annotations

from ..clock import now_ms
from .models import RUN_STATUSES as RUN_STATUSES  # what `run.list` may filter by
from .models import RunQueue


def park_queued_run(run_id: str) -> None:
    """Park the run's queue row if it is queued (a run with no worker that is paused)."""
    RunQueue.update(status="parked", updated_at=now_ms()).where(
        (RunQueue.run == run_id) & (RunQueue.status == "queued")
    ).execute()
