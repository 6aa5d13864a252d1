"""What `host status` reads from the database (SPEC §5): the counts of runs, claims,
interactions and effects, and the lifecycle contradictions between runs and their queue
rows.
"""

from __future__ import annotations

from ..clock import now_ms
from .models import Effect, InteractiveRequest, Lease, Run, RunQueue
from .models import HostState as HostState  # the rows of the live hosts it lists
from .prepared import tuple_rows
from .run_claims import TERMINAL_QUEUE_STATUSES

ALLOWED_QUEUE_FOR_RUN = {
    # A run that never started may be parked (paused, or its launch made no progress).
    "queued": ("queued", "starting", "parked"),
    "running": ("starting", "running", "parked"),
    "waiting": ("parked", "done"),  # done: answered, a continuation run carries on
    "completed": ("done",),
    "failed": ("failed",),
    "timed_out": ("failed",),
    "cancelled": ("cancelled",),
}


def host_status_counts() -> dict[str, int]:
    """The run counts of `host status`, read from the database."""
    now = now_ms()
    queue_counts: dict[str, int] = {}
    for row in RunQueue.select(RunQueue.status):
        queue_counts[row.status] = queue_counts.get(row.status, 0) + 1
    expired_claims: int = (
        Lease.select()
        .join(RunQueue, on=(RunQueue.run == Lease.run))
        .where(
            Lease.owner_id.is_null(False)
            & (Lease.expires_at <= now)
            & RunQueue.status.not_in(TERMINAL_QUEUE_STATUSES)
        )
        .count()
    )
    return {
        "queuedRuns": queue_counts.get("queued", 0),
        "runningRuns": queue_counts.get("starting", 0) + queue_counts.get("running", 0),
        "parkedRuns": queue_counts.get("parked", 0),
        "waitingRuns": Run.select().where(Run.status == "waiting").count(),
        # Durable: a held run's queue row carries its error code across restarts.
        "blockedRuns": RunQueue.select()
        .where((RunQueue.status == "parked") & RunQueue.error_code.is_null(False))
        .count(),
        "expiredClaims": expired_claims,
        "pendingInteractions": InteractiveRequest.select()
        .where(InteractiveRequest.status == "pending")
        .count(),
        "ambiguousEffects": _ambiguous_effects(),
        "lifecycleContradictions": _lifecycle_contradictions(),
    }


def _ambiguous_effects() -> int:
    """Effects an operator must settle: ambiguous ones, and ones left `applying` by a
    worker that is gone (their run is no longer running)."""
    count: int = (
        Effect.select()
        .join(RunQueue, on=(RunQueue.run == Effect.run))
        .where(
            (Effect.status == "ambiguous")
            | ((Effect.status == "applying") & RunQueue.status.not_in(("starting", "running")))
        )
        .count()
    )
    return count


def _lifecycle_contradictions() -> int:
    rows = Run.select(Run.status, RunQueue.status.alias("queue_status")).join(
        RunQueue, on=(RunQueue.run == Run.run_id)
    )
    return sum(
        1 for status, queue in tuple_rows(rows) if queue not in ALLOWED_QUEUE_FOR_RUN[status]
    )
