"""The host's in-memory record of a run it supervises."""

from __future__ import annotations

from dataclasses import dataclass

from ..records import RunRecord
from ..storage.run_poison import ProgressMark
from .supervisor import WorkerSupervisor


@dataclass
class ActiveRun:
    run_id: str
    claim_token: str
    generation: int
    worker_epoch: str
    supervisor: WorkerSupervisor | None
    # The run's progress at launch: an exit that leaves it unchanged made no progress.
    progress: ProgressMark
    # The run as read after its claim committed, until worker.ready's answer used it.
    claimed: RunRecord | None = None
    # Set when the host itself decided the outcome (cancel, pause, handoff): no recovery.
    control: str | None = None
    exiting: bool = False
    # The worker said it stopped short of a durable boundary (an effect in doubt).
    parked: bool = False
    # The worker registered a process group (which its exit may leave behind).
    registered_groups: bool = False
    # The worker's own write ended the run, which released the claim: nothing to renew.
    released: bool = False
    claim_lost: bool = False
    # worker.ready's bookkeeping (its pid, the queue's `running`) rides on the next commit:
    # None before worker.ready, "deferred" until that commit, then "recorded".
    ready: str | None = None
    workflow_load_failure: str | None = None
    source_changed: str | None = None
    # Why the host could not launch the worker (an unanswered launch hook, say).
    launch_failure: str | None = None

    def stop(self, outcome: str) -> None:
        if self.supervisor is not None:
            self.supervisor.stop(outcome)
