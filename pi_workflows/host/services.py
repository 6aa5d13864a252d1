"""What a host feature may use of the host: a narrow, named set of services.

Features (``pi_workflows.host.features``) never hold the `Host` itself, so they cannot
reach into its worker table, claims or timers; what they need is here, each with the
rule it keeps.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from ..event_types import EventType
    from ..home import Home
    from ..settings import Settings
    from ..storage import StateStore
    from .features import HostFeatures
    from .host_lease import HostLease
    from .slots import WorkerSlots


class HostLife(Protocol):
    """What of the host's own state the services read (it changes while the host runs)."""

    store: StateStore
    home: Home
    host_id: str
    stopping: bool
    features: HostFeatures
    settings: Settings

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task: ...

    def after_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None: ...


class HostServices:
    def __init__(self, slots: WorkerSlots, lease: HostLease, host: HostLife) -> None:
        self._slots = slots
        self._lease = lease
        self._host = host

    @property
    def store(self) -> StateStore:
        """The state store: `transaction()` and `after_commit(callback)`."""
        return self._host.store

    @property
    def home(self) -> Home:
        return self._host.home

    @property
    def settings(self) -> Settings:
        """The settings the host started with."""
        return self._host.settings

    @property
    def host_epoch(self) -> int:
        """This host's epoch: durable receipts name it."""
        return self._lease.epoch or 0

    @property
    def is_stopping(self) -> bool:
        return self._host.stopping

    @property
    def host_id(self) -> str:
        return self._host.host_id

    def worker_load(self) -> tuple[int, int]:
        """(worker slots in use, the worker limit) of this host."""
        slots = self._slots
        return slots.busy(), slots.max_workers

    def claim_failure(self) -> str | None:
        """The claim plugins failing now (named), or None."""
        return self._slots.failure()

    def is_vetoed(self, run_id: str, revision: int) -> bool:
        """True while a claim plugin's remembered veto holds for the run."""
        return self._slots.is_vetoed(run_id, revision)

    def session_has_coordinator(self, session_id: str) -> bool:
        """Whether a live client coordinates the session on this host."""
        return self._host.features.session_has_coordinator(session_id)

    def audience_channels(self, audience: str) -> tuple[str, ...]:
        """The channels that may answer decisions for `audience` on this host."""
        return self._host.features.audience_channels(audience)

    @property
    def is_duty_host(self) -> bool:
        """True on the one host that runs database-wide duties (decision deadlines,
        channel effects): always on SQLite, the oldest live host on PostgreSQL."""
        return self._lease.is_duty_host

    @property
    def previous_heartbeat_at(self) -> int | None:
        """The last heartbeat of the host before this one (epoch ms), if any."""
        return self._lease.previous_heartbeat_at

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run a coroutine on the host's loop; the host waits for it when it stops."""
        return self._host.spawn(coroutine)

    def schedule_claim_pass(self) -> None:
        """A run became claimable: look for work soon (never inside the claim pass)."""
        self._slots.schedule_pass()

    def claim_now(self) -> None:
        """A run became claimable in this transaction: claim it (and any other) for the
        free worker slots in the same commit (with claim plugins: just after it); the
        workers launch after commit."""
        self._slots.claim_free_slots()

    def unblock_run(self, run_id: str) -> None:
        """An operator cleared what held the run (inside a transaction): after commit it
        may be claimed again, by this host's next claim pass."""
        slots = self._slots

        def release() -> None:
            slots.blocked_runs.discard(run_id)
            slots.schedule_pass()

        self._host.store.after_commit(release)

    def is_run_busy(self, run_id: str) -> bool:
        """True while this host runs, or is about to launch, a worker for the run."""
        return self._slots.is_busy(run_id)

    def admit(self, run_id: str) -> bool:
        """Outside a transaction: a worker slot is free and the claim plugins allow the
        run now; then `claim_run(run_id, admitted=True)` in the transaction."""
        return self._slots.admit(run_id)

    def claim_run(
        self, run_id: str, *, admitted: bool = False, allow_pending_interaction: bool = False
    ) -> int | None:
        """Claim a run through the claim gate (inside a transaction); its worker launches
        after commit. None when it was not claimed (no slot, not admitted, taken)."""
        return self._slots.claim_run(
            run_id, admitted=admitted, allow_pending_interaction=allow_pending_interaction
        ).generation

    def release_to_waiting(self, run_id: str, event_type: EventType) -> bool:
        """Park the run this host's worker holds as `waiting`; the worker is let go."""
        return self._slots.release_to_waiting(run_id, event_type)

    def run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        """Announce, after commit, that a feature's write moved a run out of `running`."""
        self._host.after_run_stopped(run_id, old_status, new_status)

    def ensure_terminal_message(self, run_id: str) -> None:
        """Ask for the run's terminal message if it has ended (never raises)."""
        self._host.features.ensure_terminal_message(run_id)
