"""What holds a run, as `run why` reads it (SPEC §13), beyond its own rows (``run_rows``):
the epoch its claim was taken under, its running node, the session step it waits for, the
runs queued ahead of it and its latest event of a kind. The sentences are the host's."""

from __future__ import annotations

from ..event_types import EventType
from .models import (
    Event,
    HostState,
    InteractiveRequest,
    Lease,
    NodeAttempt,
    Run,
    RunQueue,
    RunWorker,
)


def claim_epoch(lease: Lease) -> int | None:
    """The host epoch the claim of `lease` was taken under: its worker's, else the
    owner's host row."""
    epoch: int | None = (
        RunWorker.select(RunWorker.host_epoch)
        .where((RunWorker.run == lease.run_id) & (RunWorker.generation == lease.generation))
        .scalar()
    )
    if epoch is None:
        epoch = (
            HostState.select(HostState.epoch).where(HostState.host_id == lease.owner_id).scalar()
        )
    return epoch


def running_attempt(run_id: str) -> NodeAttempt | None:
    """A node attempt of the run that is running now."""
    attempt: NodeAttempt | None = (
        NodeAttempt.select()
        .where((NodeAttempt.run == run_id) & (NodeAttempt.status == "running"))
        .first()
    )
    return attempt


def pending_session_step(run_id: str) -> InteractiveRequest | None:
    """A session step the run waits for."""
    request: InteractiveRequest | None = (
        InteractiveRequest.select()
        .where((InteractiveRequest.run == run_id) & (InteractiveRequest.status == "pending"))
        .first()
    )
    return request


def runs_queued_ahead(queue: RunQueue) -> int:
    """How many queued, unpaused runs became available before the run of `queue`."""
    ahead: int = (
        RunQueue.select()
        .join(Run, on=(Run.run_id == RunQueue.run))
        .where(
            (RunQueue.status == "queued")
            & (Run.paused == False)  # noqa: E712 (a SQL comparison)
            & (
                (RunQueue.available_at < queue.available_at)
                | (
                    (RunQueue.available_at == queue.available_at)
                    & (RunQueue.created_at < queue.created_at)
                )
            )
        )
        .count()
    )
    return ahead


def latest_event(run_id: str, event_type: EventType) -> tuple[str, int] | None:
    """The actor and time of the run's latest event of `event_type`, if it has one."""
    event = (
        Event.select(Event.actor, Event.recorded_at)
        .where((Event.run == run_id) & (Event.event_type == event_type))
        .order_by(Event.revision.desc())
        .first()
    )
    return (event.actor, event.recorded_at) if event is not None else None
