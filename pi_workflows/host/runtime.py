"""The host process: the composition root, its start and stop order, and its timers.

`Host` builds the pieces and hands each the narrow parts it uses: `WorkerSlots` (the
claim gate, `slots.py`), `WorkerLives` (each worker from launch to recovery,
`worker_lives.py`), the client operations and server, the host features. No other module
imports it. Everything runs on one asyncio event loop. Database work is short and synchronous on
that loop (SQLite serialises writers anyway); workflow code runs only in workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import plugins, settings
from ..clock import now_ms
from ..errors import DatabaseUnavailableError, HostLeaseLostError
from ..home import Home, home_key, prepare_home
from ..hook_deadline import DeadlineRunner
from ..storage import (
    StateStore,
    host_leases,
    open_state,
    run_claims,
)
from ..storage.database import is_disk_full
from ..worker import zygote
from . import epoch_lease, forwarded_commands, hard_stop, lease_recovery, process_groups
from .commit_group import CommitGroup
from .effect_recovery import EffectRecovery
from .features import HostFeatures
from .forkserver import ForkServer, Standby
from .host_lease import HostLease
from .host_log import configure_host_logging
from .human_decisions import HumanDecisions
from .lock import HostLock, acquire_host_lock
from .operations import Operations
from .process_identity import is_same_process
from .profile import host_profile
from .restarts import Restarts
from .retention import Retention
from .run_watch import RunWatches
from .run_why import RunWhy
from .services import HostServices
from .sessions import Sessions
from .slots import WorkerSlots
from .terminal_messages import TerminalMessages
from .worker_fence import LeaseClock
from .worker_lives import WorkerLives

log = logging.getLogger("pi_workflows.host")


# The host's features, plugins on its private hookspec (see `host/features.py`), in the
# order their hooks run.
FEATURES: tuple[Callable[[HostServices], object], ...] = (
    TerminalMessages,
    Restarts,
    HumanDecisions,
    Sessions,
    EffectRecovery,
    RunWhy,
    RunWatches,
    Retention,
)


@dataclass(frozen=True)
class HostTimings:
    """Timer periods; tests and benchmarks shorten them through the settings."""

    heartbeat_s: float = 5.0  # a third of the host lease: two missed beats are survivable
    poll_s: float = 2.0
    run_lease_ms: int = run_claims.RUN_CLAIM_LEASE_MS
    host_lease_ms: int = epoch_lease.HOST_LEASE_MS
    worker_startup_s: float = 15.0
    stop_wait_s: float = hard_stop.DEFAULT_STOP_WAIT_S

    @classmethod
    def from_settings(cls, values: settings.Settings) -> HostTimings:
        return cls(
            heartbeat_s=values.number("heartbeat_s"),
            poll_s=values.number("poll_s"),
            run_lease_ms=values.integer("run_lease_ms"),
            host_lease_ms=values.integer("host_lease_ms"),
            worker_startup_s=values.number("worker_startup_s"),
            stop_wait_s=values.number("stop_wait_s"),
        )


class Host:
    def __init__(
        self,
        home: Home,
        database_url: str | None = None,
        timings: HostTimings | None = None,
        max_workers: int | None = None,
        host_settings: settings.Settings | None = None,
        fork_standby: Standby | None = None,
    ) -> None:
        self.home = home
        self.database_url = database_url
        # Resolved once: `host status` shows what this host runs with, whatever changes later.
        self.settings = host_settings or settings.resolve()
        self.timings = timings or HostTimings.from_settings(self.settings)
        self.max_workers = max_workers or self.settings.integer("max_workers")
        self.max_node_crashes = self.settings.integer("max_node_crashes")
        self.claim_window = self.settings.integer("claim_window")
        self.host_id = f"host-{secrets.token_hex(8)}"
        self.store: StateStore
        self.worker_commits: CommitGroup
        self.lock: HostLock | None = None
        self.started_at = 0
        self.slots = WorkerSlots(
            self.host_id,
            max_workers=self.max_workers,
            claim_window=self.claim_window,
            run_lease_ms=self.timings.run_lease_ms,
            hooks=DeadlineRunner(self.settings.integer("hook_timeout_ms") / 1000),
        )
        plugins.set_hook_deadline(self.settings.integer("hook_timeout_ms") / 1000)
        self.stopping = False
        self._stop_requested = False
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._timers: list[asyncio.Task] = []
        self.server: Any = None
        self.stop_deadline = hard_stop.StopDeadline(
            lambda: self.lock,
            self._worker_pids,
            home.socket_path,
            bound_s=self.timings.stop_wait_s + hard_stop.HARD_STOP_MARGIN_S,
        )
        self.operations = Operations(self.slots, self)
        self.fork_server = (
            ForkServer(sys.executable, str(home.root), fork_standby)
            if self.settings.switch("fork_server")
            else None
        )
        lease_clock = LeaseClock(self.timings.host_lease_ms, self.timings.run_lease_ms)
        self.lease = HostLease(
            home,
            self.host_id,
            self.slots,
            lease_clock,
            on_new_epoch=self._serve_epoch,
            host_lease_ms=self.timings.host_lease_ms,
            run_lease_ms=self.timings.run_lease_ms,
            is_stopping=lambda: self._stop_requested or self.stopping,
            stop=self._stop_for_good,
        )
        services = HostServices(self.slots, self.lease, self)
        self.features = HostFeatures([feature(services) for feature in FEATURES])
        self.features.register_operations(self.operations.table)
        self.workers = WorkerLives(
            self.slots,
            home=home,
            database_url=database_url,
            features=self.features,
            fork_server=self.fork_server,
            lease_clock=lease_clock,
            worker_startup_s=self.timings.worker_startup_s,
            max_node_crashes=self.max_node_crashes,
            spawn=self.spawn,
            is_stopping=lambda: self.stopping,
        )

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Startup order of SPEC §5: lock, previous host, epoch, recovery, listen, timers."""
        from .server import ClientServer

        prepare_home(self.home)
        self.lock = acquire_host_lock(self.home.lock_path, self.host_id)
        try:
            self.store = open_state(
                self.home,
                self.database_url,
                idle_transaction_limit_ms=self.timings.host_lease_ms,
            )
            self.worker_commits = CommitGroup(self.store, self.slots.claim_free_slots)
            with self.store.transaction():
                previous = host_leases.previous_host(home_key(self.home))
            if previous is not None:
                reaped = reap_orphan_workers(None if self.store.is_sqlite else previous.epoch)
                if reaped:
                    log.info("reaped %d orphan worker process group(s)", reaped)
            self.lease.acquire(self.store)
            epoch = self.lease.epoch
            assert epoch is not None
            self.workers.open(self.store, self.worker_commits, epoch)
            self.slots.open(self.store, epoch, self.workers)
            lease_recovery.watch_connection(self.store, self.lease.heartbeat, self._reconnected)
            # Commands the previous host's workers started die before any run is claimed.
            await process_groups.stop_orphaned_groups(self.store)
            self.features.startup()
            self.started_at = now_ms()
            self.server = ClientServer(
                self.operations,
                home=self.home,
                host_settings=self.settings,
                store=self.store,
                commits=self.worker_commits,
            )
            await self.server.listen()
        except BaseException:
            self._release_identity()
            raise
        self._timers = [
            asyncio.create_task(self._every(self.timings.heartbeat_s, self.lease.heartbeat)),
            asyncio.create_task(self._every(self.timings.poll_s, self._poll)),
        ]
        log.info("ready at epoch %s", epoch)
        self.slots.schedule_pass()

    def _worker_pids(self) -> list[int]:
        # Read from the deadline's thread: a copy, so the loop may change the table.
        supervisors = [active.supervisor for active in list(self.slots.active_runs.values())]
        return [s.pid for s in supervisors if s is not None and s.pid is not None]

    def _serve_epoch(self, epoch: int) -> None:
        """The lease was taken again: the workers and claims from now on are `epoch`'s."""
        self.slots.epoch = self.workers.epoch = epoch

    def _stop_for_good(self) -> None:
        self._stop_requested = True
        self.spawn(self.stop())

    def _release_identity(self) -> None:
        self.lease.release()
        with contextlib.suppress(OSError):
            self.home.socket_path.unlink(missing_ok=True)
        if self.lock is not None:
            try:
                self.lock.release()
            except OSError as error:  # a home made read-only: the lock outlives us, stale
                log.error("could not remove the lock file %s: %s", self.lock.path, error)
        with contextlib.suppress(Exception):
            self.store.close()

    async def stop(self) -> None:
        """Stop order of SPEC §5: timers, socket, pending claims, workers, identity."""
        if self.stopping:
            # A second stop (another signal) waits for the first, which must not wait for it.
            self._tasks.discard(asyncio.current_task())
            await self.stopped.wait()
            return
        self.stopping = True
        self.slots.close()
        self.stop_deadline.arm()
        for timer in self._timers:
            timer.cancel()
        if self.server is not None:
            with hard_stop.stop_step("closing the socket"):
                await self.server.close()
        # A host whose lease was taken over is fenced out: it parks nothing; nor does one
        # whose database is down (the claims expire and the next owner decides).
        with hard_stop.stop_step("parking pending claims"), self.store.transaction():
            for run_id, token in list(self.slots.pending_claims.items()):
                run_claims.park_run(run_id, token)
        self.slots.pending_claims.clear()
        handed_off = list(self.slots.active_runs.values())
        stops = []
        for active in handed_off:
            active.control = active.control or "handoff"
            if active.supervisor is not None:
                task = active.supervisor.stop("orphaned")
                if task is not None:
                    stops.append(task)
        # After the stops: a worker still being forked is then told not to start.
        if self.fork_server is not None:
            with hard_stop.stop_step("closing the fork server"):
                await self.fork_server.close()
        deadline = asyncio.get_running_loop().time() + self.timings.stop_wait_s
        busy = await _finish_by(deadline, set(stops))
        busy |= await _finish_by(deadline, self._tasks - {asyncio.current_task()})
        if busy:
            log.error(
                "stopping without %d task(s) still busy after %.0f s",
                len(busy),
                self.timings.stop_wait_s,
            )
            for task in busy:
                task.cancel()
        with hard_stop.stop_step("parking handed-off runs"), self.store.transaction():
            for active in handed_off:
                if active.control == "handoff":
                    run_claims.park_run(active.run_id, active.claim_token)
        with hard_stop.stop_step("stopping the host's features"):
            self.features.stopping()
        self._release_identity()
        self.stopped.set()
        self.stop_deadline.finished()
        log.info("stopped")

    async def _every(self, period_s: float, action: Any) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                action()
            except DatabaseUnavailableError:
                pass  # said once when the connection was lost; the next tick tries again
            except Exception as error:
                if not is_disk_full(error):  # a full disk was said once by the store
                    log.exception("timer action failed")

    def _reconnected(self) -> None:
        """The lost database connection is back. It may have dropped at a COMMIT that
        happened unseen, and what was to follow that commit (a launch, a message) did
        not: reconcile from what the database says. If it is lost again meanwhile, the
        next reconnect reconciles."""
        try:
            self.slots.settle_unknown_claims()
        except (DatabaseUnavailableError, HostLeaseLostError) as error:
            log.warning("claims not reconciled after the reconnect: %s", error)
        self.features.reconnected()

    def _poll(self) -> None:
        if self.lock is not None and not self.lock.is_held():
            # Removed with its home (or replaced): no client can find this host any more,
            # nor `host stop` end it, and a new host may start in its place. On a shared
            # database its runs would stay claimed for good.
            if not self._stop_requested:
                log.error(
                    "the lock file %s no longer names this host (its home was removed, or "
                    "the file was); the host stops",
                    self.lock.path,
                )
                self._stop_for_good()
            return
        if not self.store.is_sqlite:
            self.lease.take_over_expired_hosts()
            try:
                forwarded_commands.apply_pending(self.slots, self.store, self.operations.table)
            except Exception:
                log.exception("forwarded commands failed")
        self.slots.poll()
        self.features.poll()
        with contextlib.suppress(HostLeaseLostError):  # fenced out: the next owner decides
            self.store.flush_deferred()

    def spawn(self, coroutine: Any) -> asyncio.Task:
        """Keep a reference to background tasks so they finish before stop returns."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def after_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        """After-commit effects of a run leaving `running`; none of them may raise."""
        self.features.run_stopped(run_id, old_status, new_status)

    # --- what the client operations see (`operations.HostControl`) ----------------------

    def serving_epoch(self) -> int | None:
        """The epoch clients are served under; None while the host starts or stops."""
        return None if self.stopping else self.lease.epoch

    def request_stop(self) -> None:
        self.spawn(self.stop())

    def _feature_status(self) -> dict[str, Any]:
        try:
            return self.features.host_status()
        except DatabaseUnavailableError:  # host status says why instead
            return {}

    def status_facts(self) -> dict[str, Any]:
        """`host status`'s facts of this process; the operations add the database's."""
        return {
            "socketAvailable": self.server is not None,
            "epoch": self.lease.epoch,
            "uptimeMs": now_ms() - self.started_at if self.started_at else 0,
            "connectedClients": self.server.connected_clients if self.server else 0,
            **self._feature_status(),
            **host_profile(self.home, self.database_url, self.settings),
            "dutyHost": self.lease.is_duty_host,
        }


async def _finish_by(deadline: float, tasks: set[asyncio.Task]) -> set[asyncio.Task]:
    """Wait for `tasks` until `deadline` (loop time); the ones still running."""
    if not tasks:
        return set()
    timeout = max(0.0, deadline - asyncio.get_running_loop().time())
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in done:  # their failures were reported where they happened
        if not task.cancelled():
            task.exception()
    return pending


def reap_orphan_workers(host_epoch: int | None) -> int:
    """Kill worker process groups a crashed host left running on this machine.

    On a shared database only the workers of this home's previous host (`host_epoch`)
    ran here; on SQLite (None) every recorded live worker did. Only exact matches (pid
    and start identity) are killed, so a recycled pid is safe.
    """
    reaped = 0
    for row in host_leases.workers_left_running(host_epoch):
        if row.pid is None or not row.process_start_identity:
            continue  # (no pid: `workers_left_running` already leaves such rows out)
        if is_same_process(row.pid, row.process_start_identity):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(row.pid, signal.SIGKILL)
                reaped += 1
    return reaped


def run_host_forever(
    home: Home,
    database_url: str | None,
    log_file: Path | None,
    host_settings: settings.Settings,
    forked_standby: zygote.ForkedStandby | None,
) -> int:
    """`pi-workflows host run` (`cli/host_commands.py`, which resolved the settings and
    forked the standby): serve until SIGINT/SIGTERM or `host.stop`."""
    configure_host_logging(log_file)
    standby = Standby.adopt(forked_standby) if forked_standby is not None else None

    async def main() -> None:
        host = Host(home, database_url, host_settings=host_settings, fork_standby=standby)
        await host.start()
        loop = asyncio.get_running_loop()

        def stop_on_signal() -> None:
            host.stop_deadline.arm()  # even if the loop never gets to the stop
            loop.call_soon_threadsafe(lambda: host.spawn(host.stop()))

        hard_stop.on_stop_signals(stop_on_signal)
        await host.stopped.wait()
        # A signal that comes while the stopped host exits must not turn its clean exit
        # into a death by that signal.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)

    asyncio.run(main())
    return 0
