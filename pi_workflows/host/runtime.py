"""The host process: start and stop order, timers, claim pass, worker activation.

Everything runs on one asyncio event loop. Database work is short and synchronous on
that loop (SQLite serialises writers anyway); workflow code runs only in workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from ..errors import HostLeaseLostError, PiWorkflowsError
from ..home import Home, home_key, machine_name, prepare_home
from ..hook_deadline import DeadlineRunner
from ..protocol.worker_messages import LAUNCH_SCHEMA, PROTOCOL_VERSION
from ..records import Claim, WorkerSettings
from ..storage import (
    StateStore,
    effects,
    open_state,
    put_json,
    put_text,
    run_claims,
    run_workers,
)
from ..storage.database import masked_url
from ..storage.models import RunWorker
from ..storage.runs import current_status, run_fields
from ..worker.command import is_worker_command
from . import epoch_lease, forwarded_commands, process_groups, run_progress
from .active_run import ActiveRun
from .commit_group import CommitGroup
from .effect_recovery import EffectRecovery
from .features import HostFeatures
from .forkserver import ForkServer
from .host_log import configure_host_logging
from .human_decisions import HumanDecisions
from .lock import HostLock, acquire_host_lock
from .operations import Operations
from .process_identity import is_running, is_same_process, start_identity
from .profile import host_profile
from .restarts import Restarts
from .retention import Retention
from .run_watch import RunWatches
from .run_why import RunWhy
from .services import HostServices
from .sessions import Sessions
from .slots import PreparedWorker, WorkerSlots
from .supervisor import WorkerExit, WorkerSupervisor
from .terminal_messages import TerminalMessages
from .worker_gateway import WorkerGateway

log = logging.getLogger("pi_workflows.host")

# How long a stop waits for its workers and tasks (a worker gets KILL_GRACE_S before its
# SIGKILL); whatever is still busy then is cancelled, so a stop never hangs.
STOP_WAIT_S = 10.0

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

    @classmethod
    def from_settings(cls, values: settings.Settings) -> HostTimings:
        return cls(
            heartbeat_s=values["heartbeat_s"],
            poll_s=values["poll_s"],
            run_lease_ms=values["run_lease_ms"],
            host_lease_ms=values["host_lease_ms"],
            worker_startup_s=values["worker_startup_s"],
        )


class Host:
    def __init__(
        self,
        home: Home,
        database_url: str | None = None,
        timings: HostTimings | None = None,
        max_workers: int | None = None,
        host_settings: settings.Settings | None = None,
    ) -> None:
        self.home = home
        self.database_url = database_url
        # Resolved once: `host status` shows what this host runs with, whatever changes later.
        self.settings = host_settings or settings.resolve()
        self.timings = timings or HostTimings.from_settings(self.settings)
        self.max_workers = max_workers or self.settings["max_workers"]
        self.max_node_crashes = self.settings["max_node_crashes"]
        self.claim_window = self.settings["claim_window"]
        self.host_id = f"host-{secrets.token_hex(8)}"
        self.store: StateStore
        self.worker_commits: CommitGroup
        self.epoch_lease: epoch_lease.EpochLease | None = None
        self.lock: HostLock | None = None
        self.started_at = 0
        self.previous_heartbeat_at: int | None = None  # the last sign of life before us
        self.slots = WorkerSlots(
            self.host_id,
            max_workers=self.max_workers,
            claim_window=self.claim_window,
            run_lease_ms=self.timings.run_lease_ms,
            hooks=DeadlineRunner(self.settings["hook_timeout_ms"] / 1000),
        )
        # The oldest live host of a shared database runs the database-wide duties
        # (decision deadlines, channel effects); on SQLite the one host always does.
        self.is_duty_host = True
        self.stopping = False
        self._stop_requested = False
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._timers: list[asyncio.Task] = []
        self.server: Any = None
        self.operations = Operations(self.slots, self)
        self.fork_server = (
            ForkServer(sys.executable, str(home.root)) if self.settings["fork_server"] else None
        )
        services = HostServices(self.slots, self)
        self.features = HostFeatures([feature(services) for feature in FEATURES])
        self.features.register_operations(self.operations.table)

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Startup order of SPEC §5: lock, previous host, epoch, recovery, listen, timers."""
        from .server import ClientServer

        prepare_home(self.home)
        self.lock = acquire_host_lock(self.home.lock_path, self.host_id)
        try:
            self.store = open_state(self.home, self.database_url)
            self.worker_commits = CommitGroup(self.store, self.slots.claim_free_slots)
            identity = start_identity(os.getpid()) or ""
            key = home_key(self.home)
            with self.store.transaction():
                previous = epoch_lease.previous_host(key)
            if previous is not None:
                reaped = reap_orphan_workers(None if self.store.is_sqlite else previous.epoch)
                if reaped:
                    log.info("reaped %d orphan worker process group(s)", reaped)
            with self.store.transaction():
                previous = epoch_lease.previous_host(key)
                previous_host_id = previous.host_id if previous else None
                self.previous_heartbeat_at = previous.heartbeat_at if previous else None
                # The home's row names a host on this machine: its pid can be checked.
                holder_is_dead = bool(
                    previous is not None
                    and previous.pid
                    and not is_running(previous.pid, previous.process_start_identity or "")
                )
                self.epoch_lease = epoch_lease.acquire_epoch(
                    self.host_id,
                    os.getpid(),
                    identity,
                    key=key,
                    socket_address=f"{machine_name()}:{self.home.socket_path}",
                    single_host=self.store.is_sqlite,
                    lease_ms=self.timings.host_lease_ms,
                    holder_is_dead=holder_is_dead,
                )
                epoch_lease.recover_previous_host(previous_host_id)
            self.slots.open(self.store, self.epoch_lease.epoch, self)
            if not self.store.is_sqlite:
                lease = self.epoch_lease
                self.store.fence = lambda: epoch_lease.fence(lease)
                self.is_duty_host = epoch_lease.is_duty_host(lease)
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
            asyncio.create_task(self._every(self.timings.heartbeat_s, self._heartbeat)),
            asyncio.create_task(self._every(self.timings.poll_s, self._poll)),
        ]
        log.info("ready at epoch %s", self.epoch_lease.epoch)
        if self.fork_server is not None:
            await self.fork_server.start()
        self.slots.schedule_pass()

    def _release_identity(self) -> None:
        if self.epoch_lease is not None:
            with contextlib.suppress(Exception):
                epoch_lease.release_epoch(self.epoch_lease)
            self.epoch_lease = None
        with contextlib.suppress(OSError):
            self.home.socket_path.unlink(missing_ok=True)
        if self.lock is not None:
            self.lock.release()
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
        for timer in self._timers:
            timer.cancel()
        if self.server is not None:
            await self.server.close()
        # A host whose lease was taken over is fenced out: it parks nothing.
        with contextlib.suppress(HostLeaseLostError), self.store.transaction():
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
            await self.fork_server.close()
        deadline = asyncio.get_running_loop().time() + STOP_WAIT_S
        busy = await _finish_by(deadline, set(stops))
        busy |= await _finish_by(deadline, self._tasks - {asyncio.current_task()})
        if busy:
            log.error("stopping without %d task(s) still busy after %.0f s", len(busy), STOP_WAIT_S)
            for task in busy:
                task.cancel()
        with contextlib.suppress(HostLeaseLostError), self.store.transaction():
            for active in handed_off:
                if active.control == "handoff":
                    run_claims.park_run(active.run_id, active.claim_token)
        self.features.stopping()
        self._release_identity()
        self.stopped.set()
        log.info("stopped")

    async def _every(self, period_s: float, action: Any) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                action()
            except Exception:
                log.exception("timer action failed")

    def _heartbeat(self) -> None:
        """Renew the host's lease and the claims of its live workers, in one commit."""
        assert self.epoch_lease is not None
        renewing = [
            active
            for active in self.slots.active_runs.values()
            if not (active.control or active.exiting or active.released)
        ]
        try:
            with self.store.transaction():
                epoch_lease.renew_epoch(self.epoch_lease, self.timings.host_lease_ms)
                lost = [
                    active
                    for active in renewing
                    if not run_claims.renew_claim(
                        active.run_id, active.claim_token, self.timings.run_lease_ms
                    )
                ]
        except PiWorkflowsError as error:
            self._lease_lost(error)
            return
        for active in lost:
            active.claim_lost = True
            active.stop("claimLost")

    def _poll(self) -> None:
        if not self.store.is_sqlite:
            self._take_over_expired_hosts()
            try:
                forwarded_commands.apply_pending(self.slots, self.store, self.operations.table)
            except Exception:
                log.exception("forwarded commands failed")
        self.slots.poll()
        self.features.poll()
        with contextlib.suppress(HostLeaseLostError):  # fenced out: the next owner decides
            self.store.flush_deferred()

    def _lease_lost(self, error: PiWorkflowsError) -> None:
        """Stop once: the host's lease is gone, so it may write nothing more."""
        if self._stop_requested:
            return
        self._stop_requested = True
        log.error("host lease lost: %s", error)
        self.spawn(self.stop())

    def _take_over_expired_hosts(self) -> None:
        """Shared database: free the runs of hosts whose lease expired (SPEC §14)."""
        assert self.epoch_lease is not None
        try:
            with self.store.transaction():
                taken = epoch_lease.take_over_expired_hosts(self.epoch_lease)
            self.is_duty_host = epoch_lease.is_duty_host(self.epoch_lease)
        except PiWorkflowsError as error:
            self.is_duty_host = False
            self._lease_lost(error)
            return
        if taken:
            log.warning("took over the runs of expired host epoch(s) %s", taken)

    def spawn(self, coroutine: Any) -> asyncio.Task:
        """Keep a reference to background tasks so they finish before stop returns."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- workers -----------------------------------------------------------------------

    def record_worker(self, run_id: str, claim: Claim) -> PreparedWorker:
        """The worker a claim launches: its launch envelope and ``RunWorker`` row.

        Called in the claim's transaction, so the claim and its worker commit together.
        """
        project_path, workflow_source, definition_digest, input_hash, revision = run_fields(
            run_id, "project_path", "workflow_source", "definition_digest", "input_hash", "revision"
        )
        worker_epoch = secrets.token_hex(16)
        envelope = {
            "schema": LAUNCH_SCHEMA,
            "runId": run_id,
            "generation": claim.generation,
            "workerEpoch": worker_epoch,
            "projectPath": project_path,
            "workflowSource": json.loads(workflow_source),
            "definitionDigest": definition_digest,
            "inputHash": input_hash,
            "protocolVersion": PROTOCOL_VERSION,
            # Recorded with the worker row and read by plugins: never the password.
            "databaseUrl": masked_url(self.database_url) if self.database_url else None,
            "home": str(self.home.root),
        }
        progress = run_progress.progress_mark(run_id)
        run_workers.record_worker(
            worker_epoch,
            run_id,
            claim.generation,
            self.epoch_lease.epoch if self.epoch_lease else 0,
            put_json(envelope),
            revision,
        )
        return PreparedWorker(worker_epoch, envelope, progress)

    def launch(self, run_id: str, token: str, claim: Claim, worker: PreparedWorker) -> None:
        """After the claim committed (`WorkerSlots`): the worker's life begins."""
        self.spawn(self.activate(run_id, token, claim.generation, worker))

    def _drop_worker(self, worker: PreparedWorker) -> None:
        """A recorded worker that will never launch (its claim was let go first)."""
        run_workers.drop_worker(worker.worker_epoch)

    async def activate(
        self, run_id: str, token: str, generation: int, worker: PreparedWorker
    ) -> None:
        slots = self.slots
        if slots.pending_claims.get(run_id) != token:
            # Cancelled or paused before activation: nothing to launch.
            with self.store.transaction():
                self._drop_worker(worker)
            return
        if self.stopping or run_id in slots.active_runs:
            slots.pending_claims.pop(run_id, None)
            with self.store.transaction():
                self._drop_worker(worker)
                run_claims.park_run(run_id, token)
            return
        worker_epoch, envelope, progress = worker.worker_epoch, worker.envelope, worker.progress
        active = ActiveRun(run_id, token, generation, worker_epoch, None, progress)
        slots.active_runs[run_id] = active
        slots.pending_claims.pop(run_id, None)
        try:
            # Effects an earlier worker left applying (its host died) are settled first;
            # a read decides, so a run without such effects takes no write lock here.
            in_doubt: list[str] = []
            if effects.has_unsettled(run_id):
                with self.store.transaction():
                    in_doubt = effects.recover_interrupted(run_id, generation)
                    if in_doubt:
                        run_claims.park_for_ambiguous_effect(run_id, token, in_doubt)
                        self._finish_worker(active, WorkerExit("orphaned", None, None, None))
            if in_doubt:
                slots.blocked_runs.add(run_id)
                return
            result = await self._run_worker(active, envelope)
            self._finish_worker(active, result)
            await process_groups.stop_orphaned_groups(self.store, run_id)
            # A lost claim is a hand-off: the new owner decides, this host writes nothing.
            needs_recovery = result.outcome != "exited" or bool(
                active.workflow_load_failure or active.source_changed or active.parked
            )
            if active.control is None and not active.claim_lost and needs_recovery:
                self._recover_worker_exit(active, result.outcome)
        except Exception as error:
            if isinstance(error, PiWorkflowsError):  # a sentence, e.g. an unanswered hook
                active.launch_failure = str(error)
                log.error("worker of run %s failed: %s", run_id, error)
            else:
                log.exception("worker %s of run %s failed", worker_epoch, run_id)
            active.stop("crashed")
            with contextlib.suppress(Exception):
                self._finish_worker(active, WorkerExit("crashed", None, None, None))
                await process_groups.stop_orphaned_groups(self.store, run_id)
            if active.control is None:
                self._recover_worker_exit(active, "crashed")
        finally:
            slots.active_runs.pop(run_id, None)
            slots.schedule_pass()

    async def _run_worker(self, active: ActiveRun, envelope: dict[str, Any]) -> WorkerExit:
        settings = WorkerSettings(self.home.root, self.database_url, sys.executable)
        spec = plugins.worker_process(envelope, settings)
        gateway = WorkerGateway(
            active,
            self.slots,
            store=self.store,
            commits=self.worker_commits,
            features=self.features,
            state_directory=self.home.host_dir,
        )
        supervisor = WorkerSupervisor(
            spec, gateway.handle, startup_timeout_s=self.timings.worker_startup_s
        )
        active.supervisor = supervisor
        # The pid is recorded with worker.ready (WorkerGateway), not in a commit of its own.
        # A run that never ran gets worker.ready's answer with the launch: it waits in the
        # pipe when the worker reads. Only this package's worker expects it; a worker
        # process of a plugin's own keeps the round trip.
        prepared = gateway.prepare_ready if is_worker_command(spec.argv) else None
        await supervisor.start(self.fork_server, first_frame=prepared)
        if active.control:  # cancelled or paused while spawning
            supervisor.stop("cancelled")
        return await supervisor.run()

    def _finish_worker(self, active: ActiveRun, result: WorkerExit) -> None:
        stamp = now_ms()

        def record() -> None:
            run_workers.finish_worker(
                active.worker_epoch,
                result.outcome,
                stamp,
                result.exit_code,
                result.signal,
                put_text(result.diagnostic) if result.diagnostic else None,
            )

        if result.outcome == "exited" and result.exit_code == 0:
            # A clean exit is bookkeeping only: it rides on the next commit (a claim, the
            # next run's start) or the poll timer's, instead of costing one of its own.
            self.store.defer_write(record)
            return
        with self.store.transaction():
            record()

    def _recover_worker_exit(self, active: ActiveRun, outcome: str) -> None:
        """Exit recovery in the order of SPEC §7.4."""
        run_id, token = active.run_id, active.claim_token
        with self.store.transaction():
            if not run_claims.verify_claim(run_id, token, active.generation):
                return
            # Measured before effect recovery, which writes bookkeeping of its own.
            made_progress = run_progress.progress_mark(run_id) != active.progress
            in_doubt = effects.recover_interrupted(run_id, active.generation)
            if in_doubt:
                self.slots.blocked_runs.add(run_id)
                run_claims.park_for_ambiguous_effect(run_id, token, in_doubt)
                log.warning("run parked: an effect may or may not have happened")
                return
            if active.source_changed is not None:
                run_claims.park_for_source_change(run_id, token, active.source_changed)
                log.warning("run parked: its workflow source changed")
                return
            if active.workflow_load_failure is not None:
                old_status = current_status(run_id)
                if run_claims.terminate_run(
                    run_id,
                    token,
                    status="failed",
                    code="workflowLoadFailed",
                    error=active.workflow_load_failure,
                    status_detail="The supervised worker could not load the saved workflow source.",
                ):
                    self.store.after_commit(
                        lambda: self.after_run_stopped(run_id, old_status, "failed")
                    )
                return
            node, deaths = run_progress.deaths_at_current_node(run_id, self.max_node_crashes)
            if deaths >= self.max_node_crashes:
                self.slots.blocked_runs.add(run_id)
                run_claims.park_for_crash_loop(
                    run_id,
                    token,
                    f"The workflow killed its worker {deaths} times in a row at node {node!r} "
                    f"(last worker {outcome}); fix the node, then run 'pi-workflows run resume "
                    f"{run_id}' or cancel the run",
                )
                log.warning("run parked: a node killed %d workers in a row", deaths)
                return
            if not made_progress:
                self.slots.blocked_runs.add(run_id)
                run_claims.park_for_no_progress(
                    run_id,
                    token,
                    active.launch_failure
                    or f"Workflow worker {outcome} before it committed workflow progress",
                )
                log.warning("run parked after a worker made no progress")
                return
            run_claims.park_run(run_id, token)
            log.info("run parked after worker %s", outcome)

    def after_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        """After-commit effects of a run leaving `running`; none of them may raise."""
        self.features.run_stopped(run_id, old_status, new_status)

    # --- what the client operations see (`operations.HostControl`) ----------------------

    def serving_epoch(self) -> int | None:
        """The epoch clients are served under; None while the host starts or stops."""
        if self.stopping or self.epoch_lease is None:
            return None
        return self.epoch_lease.epoch

    def request_stop(self) -> None:
        self.spawn(self.stop())

    def status_facts(self) -> dict[str, Any]:
        """`host status`'s facts of this process; the operations add the database's."""
        return {
            "socketAvailable": self.server is not None,
            "epoch": self.epoch_lease.epoch if self.epoch_lease else None,
            "uptimeMs": now_ms() - self.started_at if self.started_at else 0,
            "connectedClients": self.server.connected_clients if self.server else 0,
            **self.features.host_status(),
            **host_profile(self.home, self.database_url, self.settings),
            "dutyHost": self.is_duty_host,
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
    rows = RunWorker.select(RunWorker.pid, RunWorker.process_start_identity).where(
        RunWorker.status.in_(("starting", "ready", "running")) & RunWorker.pid.is_null(False)
    )
    if host_epoch is not None:
        rows = rows.where(RunWorker.host_epoch == host_epoch)
    for row in rows:
        if row.process_start_identity and is_same_process(row.pid, row.process_start_identity):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(row.pid, signal.SIGKILL)
                reaped += 1
    return reaped


def run_host_forever(home: Home, database_url: str | None, log_file: Path | None = None) -> int:
    """`pi-workflows host run`: serve until SIGINT/SIGTERM or `host.stop`."""
    configure_host_logging(log_file)

    # The settings file's values reach this host's workers (and the agents they run) through
    # their environment, so every process of the host acts on the settings it started with.
    host_settings = settings.resolve()
    os.environ.update(host_settings.file_environment())

    async def main() -> None:
        host = Host(home, database_url, host_settings=host_settings)
        await host.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: host.spawn(host.stop()))
        await host.stopped.wait()
        # A signal that comes while the stopped host exits must not turn its clean exit
        # into a death by that signal (closing the loop would restore the defaults).
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)

    asyncio.run(main())
    return 0
