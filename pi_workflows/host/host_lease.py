"""The host's own lease (SPEC §5, §14): taken at start, renewed every heartbeat together
with the claims of the host's live workers, used each poll to take over the runs of hosts
whose lease expired (a shared database), and, once lost, taken again after every worker is
stopped — or, when that fails, the host stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

from ..clock import now_ms
from ..errors import DatabaseUnavailableError, PiWorkflowsError
from ..home import Home, home_key, machine_name
from ..storage import StateStore, host_leases, run_claims
from . import epoch_lease
from .process_identity import is_running, start_identity
from .slots import WorkerSlots
from .worker_fence import LeaseClock

log = logging.getLogger("pi_workflows.host")

# How long a takeover waits for a row lock before it leaves the expired host to the next
# poll: the event loop it runs on serves every client meanwhile.
TAKEOVER_LOCK_WAIT_MS = 200


class HostLease:
    def __init__(
        self,
        home: Home,
        host_id: str,
        slots: WorkerSlots,
        clock: LeaseClock,
        *,
        on_new_epoch: Callable[[int], None],
        host_lease_ms: int,
        run_lease_ms: int,
        is_stopping: Callable[[], bool],
        stop: Callable[[], None],
    ) -> None:
        self.home = home
        self.host_id = host_id
        self.slots = slots
        # The workers it records and claims it takes from then on are the new epoch's.
        self.on_new_epoch = on_new_epoch
        self.clock = clock
        self.host_lease_ms = host_lease_ms
        self.run_lease_ms = run_lease_ms
        self.is_stopping = is_stopping
        self.stop = stop
        self.store: StateStore
        self.held: host_leases.EpochLease | None = None
        # The oldest live host of a shared database runs the database-wide duties
        # (decision deadlines, channel effects); on SQLite the one host always does.
        self.is_duty_host = True
        self.previous_heartbeat_at: int | None = None  # the last sign of life before us

    @property
    def epoch(self) -> int | None:
        return None if self.held is None else self.held.epoch

    def acquire(self, store: StateStore) -> None:
        """Take the home's host row at start: a new epoch, the previous host recovered."""
        self.store = store
        key = home_key(self.home)
        acquiring = self.clock.renewal_starts()
        with store.transaction():
            previous = host_leases.previous_host(key)
            previous_host_id = previous.host_id if previous else None
            self.previous_heartbeat_at = previous.heartbeat_at if previous else None
            # The home's row names a host on this machine: its pid can be checked.
            holder_is_dead = bool(
                previous is not None
                and previous.pid
                and not is_running(previous.pid, previous.process_start_identity or "")
            )
            self.held = self._take_epoch(key, holder_is_dead=holder_is_dead)
            epoch_lease.recover_previous_host(previous_host_id)
        self.clock.renewed(acquiring)
        if not store.is_sqlite:
            store.fence = self.fence
            self.is_duty_host = epoch_lease.is_duty_host(self.held)

    def _take_epoch(self, key: str, *, holder_is_dead: bool) -> host_leases.EpochLease:
        return epoch_lease.acquire_epoch(
            self.host_id,
            os.getpid(),
            start_identity(os.getpid()) or "",
            key=key,
            socket_address=f"{machine_name()}:{self.home.socket_path}",
            single_host=self.store.is_sqlite,
            lease_ms=self.host_lease_ms,
            holder_is_dead=holder_is_dead,
        )

    def fence(self, later: bool = False) -> None:
        """Before each transaction on a shared database: the lease is still ours (with
        `later`, checked with the transaction's first statement: `epoch_lease.fence`)."""
        assert self.held is not None
        epoch_lease.fence(self.held, later=later)

    def release(self) -> None:
        if self.held is not None:
            with contextlib.suppress(Exception):
                host_leases.release_epoch(self.held)
            self.held = None

    def heartbeat(self) -> None:
        """Renew the host's lease and the claims of its live workers, in one commit."""
        assert self.held is not None
        renewing = [
            active
            for active in self.slots.active_runs.values()
            if not (active.control or active.exiting or active.released)
        ]
        renewing_at = self.clock.renewal_starts()
        try:
            with self.store.transaction():
                epoch_lease.renew_epoch(self.held, self.host_lease_ms)
                lost = [
                    active
                    for active in renewing
                    if not run_claims.renew_claim(
                        active.run_id, active.claim_token, self.run_lease_ms
                    )
                ]
        except DatabaseUnavailableError:
            return  # the lease is checked again (fenced) once the connection is back
        except PiWorkflowsError as error:
            self._lost(error)
            return
        self.clock.renewed(renewing_at)
        for active in lost:
            active.claim_lost = True
            active.stop("claimLost")
        for active in renewing:
            if active.supervisor is not None and not active.claim_lost:
                active.supervisor.tell_lease()

    def take_over_expired_hosts(self) -> None:
        """Shared database: free the runs of hosts whose lease expired (SPEC §14)."""
        assert self.held is not None
        try:
            taken: list[int] = []
            # Read first, outside a transaction: at almost every poll no lease has run out,
            # and the fenced transaction would cost three more round trips for nothing.
            if host_leases.expired_hosts(self.held.row_id, now_ms()):
                with self.store.transaction():
                    # A transaction the expired host still has open holds its row until
                    # the server ends that session (a host lease after it went idle): the
                    # loop does not wait for it, the next poll tries again.
                    host_leases.wait_for_locks_at_most(TAKEOVER_LOCK_WAIT_MS)
                    taken = epoch_lease.take_over_expired_hosts(self.held)
            self.is_duty_host = epoch_lease.is_duty_host(self.held)
        except DatabaseUnavailableError:
            return
        except PiWorkflowsError as error:
            self.is_duty_host = False
            self._lost(error)
            return
        except Exception as error:  # the driver's error, as the storage layer reads it
            if not host_leases.is_lock_wait_over(error):
                raise
            log.info("the takeover of an expired host waits for its open transaction to end")
            return
        if taken:
            log.warning("took over the runs of expired host epoch(s) %s", taken)

    def _lost(self, error: PiWorkflowsError) -> None:
        """The host's lease is gone: stop its workers and take a new one, or stop."""
        if self.is_stopping():
            return
        log.error("host lease lost: %s", error)
        if not self._retake():
            self.stop()

    def _retake(self) -> bool:
        """Fence the host after its lease expired and take a new epoch; False to stop.

        Every worker is stopped first: its run's claim expired with the lease, so another
        host may run the run now (the workers' own writes are refused by their claims
        anyway). The host's row is taken again only when it is still this host's or free;
        on SQLite another live host of the database refuses it, as at startup.
        """
        for active in list(self.slots.active_runs.values()):
            active.claim_lost = True
            active.stop("claimLost")
        self.slots.pending_claims.clear()  # their activations find them gone, launch nothing
        store, key = self.store, home_key(self.home)
        fence, store.fence = store.fence, None  # the old lease cannot pass its own fence
        acquiring = self.clock.renewal_starts()
        try:
            with store.transaction():
                current = host_leases.previous_host(key)
                lease = self._take_epoch(
                    key, holder_is_dead=current is None or current.host_id in (None, self.host_id)
                )
                epoch_lease.recover_previous_host(self.host_id)
        except PiWorkflowsError as error:
            log.error("could not take the host lease again, stopping: %s", error)
            return False
        finally:
            store.fence = fence
        self.held = lease
        self.clock.renewed(acquiring)
        self.on_new_epoch(lease.epoch)
        if not store.is_sqlite:
            with contextlib.suppress(PiWorkflowsError):
                self.is_duty_host = epoch_lease.is_duty_host(lease)
        log.warning("took the host lease again at epoch %d; its workers were stopped", lease.epoch)
        return True
