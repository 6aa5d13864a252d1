"""The `run_workers` rows of a host's workers: recorded with their claim, marked running
at worker.ready, finished at exit. Call these inside ``StateStore.transaction()``.
"""

from __future__ import annotations

from ..clock import now_ms
from .models import ACTIVE_WORKER_STATUSES, RunWorker
from .prepared import PreparedQuery

_INSERT = PreparedQuery(
    lambda p: RunWorker.insert(
        worker_epoch=p.worker_epoch,
        run=p.run_id,
        generation=p.generation,
        host_epoch=p.host_epoch,
        launch_envelope_hash=p.envelope_hash,
        launch_progress_revision=p.revision,
        status="starting",
        started_at=p.now,
    ),
    planned=True,
)
_MARK_RUNNING = PreparedQuery(
    lambda p: RunWorker.update(
        status="running", ready_at=p.now, pid=p.pid, process_start_identity=p.identity
    ).where((RunWorker.worker_epoch == p.worker_epoch) & (RunWorker.status == "starting")),
    planned=True,
)
_DROP = PreparedQuery(
    lambda p: RunWorker.update(status="cancelled", finished_at=p.now).where(
        (RunWorker.worker_epoch == p.worker_epoch) & (RunWorker.status == "starting")
    ),
    planned=True,
)
_DROP_UNLAUNCHED = PreparedQuery(
    lambda p: RunWorker.update(status="cancelled", finished_at=p.now).where(
        (RunWorker.run == p.run_id)
        & (RunWorker.host_epoch == p.host_epoch)
        & (RunWorker.status == "starting")
    ),
    planned=True,
)
_FINISH = PreparedQuery(
    lambda p: RunWorker.update(
        status=p.outcome,
        finished_at=p.now,
        exit_code=p.exit_code,
        signal=p.signal,
        diagnostic_hash=p.diagnostic_hash,
    ).where(
        (RunWorker.worker_epoch == p.worker_epoch) & RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
    ),
    planned=True,
)


def record_worker(
    worker_epoch: str,
    run_id: str,
    generation: int,
    host_epoch: int,
    envelope_hash: str,
    revision: int,
) -> None:
    """A worker about to launch (`starting`), recorded with its run's claim."""
    _INSERT.execute_later(
        worker_epoch=worker_epoch,
        run_id=run_id,
        generation=generation,
        host_epoch=host_epoch,
        envelope_hash=envelope_hash,
        revision=revision,
        now=now_ms(),
    )


def mark_running(worker_epoch: str, pid: int | None, identity: str | None) -> None:
    """worker.ready: the worker's pid and start identity, if it is still `starting` (a
    write nobody reads the outcome of: it travels with the transaction's next statement)."""
    _MARK_RUNNING.execute_later(worker_epoch=worker_epoch, now=now_ms(), pid=pid, identity=identity)


def drop_worker(worker_epoch: str) -> None:
    """A recorded worker that will never launch."""
    _DROP.changed(worker_epoch=worker_epoch, now=now_ms())


def drop_unlaunched(run_id: str, host_epoch: int) -> int:
    """The run's `starting` worker row of this host epoch, recorded with a claim whose
    commit the host never heard of (its connection dropped at COMMIT): that worker never
    launched. How many rows it dropped."""
    dropped: int = _DROP_UNLAUNCHED.changed(run_id=run_id, host_epoch=host_epoch, now=now_ms())
    return dropped


def finish_worker(
    worker_epoch: str,
    outcome: str,
    stamp: int,
    exit_code: int | None,
    signal: int | None,
    diagnostic_hash: str | None,
) -> None:
    """How a live worker ended (a worker already finished keeps its first outcome)."""
    _FINISH.execute_later(
        worker_epoch=worker_epoch,
        outcome=outcome,
        now=stamp,
        exit_code=exit_code,
        signal=signal,
        diagnostic_hash=diagnostic_hash,
    )
