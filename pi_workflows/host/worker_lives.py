"""Worker lives: from a committed claim to the worker's exit and its recovery (SPEC §7).

`WorkerSlots` takes the claims; `WorkerLives` records each claim's worker (in the
claim's transaction), launches it after the commit, supervises it through its
`WorkerGateway`, writes its exit, and recovers the run when the worker died or stopped
short (SPEC §7.4).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .. import plugins, worker_memory
from ..clock import now_ms
from ..errors import DatabaseUnavailableError, PiWorkflowsError
from ..protocol.worker_messages import LAUNCH_SCHEMA, PROTOCOL_VERSION
from ..records import Claim, WorkerLaunchEnvelope, WorkerSettings
from ..storage import effects, put_json, put_text, run_claims, run_poison, run_workers
from ..storage.database import masked_url
from ..storage.revisions import created_unchanged
from ..storage.runs import current_status
from ..worker.command import is_worker_command
from . import process_groups, run_progress
from .active_run import ActiveRun
from .slots import PreparedWorker, WorkerSlots
from .supervisor import WorkerExit, WorkerSupervisor
from .worker_gateway import WorkerGateway

if TYPE_CHECKING:
    import asyncio

    from ..home import Home
    from ..storage import StateStore
    from .commit_group import CommitGroup
    from .features import HostFeatures
    from .forkserver import ForkServer
    from .worker_fence import LeaseClock

log = logging.getLogger("pi_workflows.host")


class WorkerLives:
    """The `WorkerLauncher` of `WorkerSlots`: every worker's life on this host."""

    def __init__(
        self,
        slots: WorkerSlots,
        *,
        home: Home,
        database_url: str | None,
        features: HostFeatures,
        fork_server: ForkServer | None,
        lease_clock: LeaseClock,
        worker_startup_s: float,
        max_node_crashes: int,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
        is_stopping: Callable[[], bool],
    ) -> None:
        self.slots = slots
        self.home = home
        self.database_url = database_url
        self.features = features
        self.fork_server = fork_server
        self.lease_clock = lease_clock
        self.worker_startup_s = worker_startup_s
        self.max_node_crashes = max_node_crashes
        self.spawn = spawn
        self.is_stopping = is_stopping
        self.store: StateStore
        self.commits: CommitGroup
        self.epoch = 0

    def open(self, store: StateStore, commits: CommitGroup, epoch: int) -> None:
        """The host holds its epoch: workers may be recorded and launched."""
        self.store, self.commits, self.epoch = store, commits, epoch

    def record_worker(self, run_id: str, claim: Claim) -> PreparedWorker:
        """The worker a claim launches: its launch envelope and ``RunWorker`` row.

        Called in the claim's transaction, so the claim and its worker commit together.
        """
        fields, progress = run_poison.launch_read(run_id)
        project_path, workflow_source, definition_digest, input_hash, revision = fields
        worker_epoch = secrets.token_hex(16)
        envelope: WorkerLaunchEnvelope = {
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
        run_workers.record_worker(
            worker_epoch,
            run_id,
            claim.generation,
            self.epoch,
            put_json(envelope),
            revision,
        )
        return PreparedWorker(worker_epoch, envelope, progress)

    def drop_unlaunched(self, run_id: str) -> None:
        """Before a claim's worker row: the row of an earlier claim of this host whose
        commit's outcome it never learnt (the connection dropped at COMMIT) and whose
        worker therefore never launched. Only for a run the host runs no worker for; a run
        this transaction created has none to drop, and nor has any run while the host's
        connection was never lost."""
        if (
            self.store.commits_may_have_gone_unheard
            and created_unchanged(run_id) is None
            and run_workers.drop_unlaunched(run_id, self.epoch)
        ):
            log.warning(
                "run %s: an earlier claim committed although its commit seemed to fail; "
                "its worker never started, so the run is claimed again",
                run_id,
            )

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
        if self.is_stopping() or run_id in slots.active_runs:
            slots.pending_claims.pop(run_id, None)
            with self.store.transaction():
                self._drop_worker(worker)
                run_claims.park_run(run_id, token)
            return
        worker_epoch, envelope, progress = worker.worker_epoch, worker.envelope, worker.progress
        active = ActiveRun(run_id, token, generation, worker_epoch, None, progress, worker.claimed)
        slots.active_runs[run_id] = active
        slots.pending_claims.pop(run_id, None)
        try:
            # Effects an earlier worker left applying (its host died) are settled first;
            # a read decides, so a run without such effects takes no write lock here. A
            # run still `queued` at its claim never ran a node: it has no effects.
            in_doubt: list[str] = []
            if progress.run_status != "queued" and effects.has_unsettled(run_id):
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
            # A run queued at its claim had no earlier worker: only groups this one
            # registered can be left behind.
            if active.registered_groups or progress.run_status != "queued":
                await process_groups.stop_orphaned_groups(self.store, run_id)
            # A lost claim is a hand-off: the new owner decides, this host writes nothing.
            needs_recovery = result.outcome != "exited" or bool(
                active.workflow_load_failure or active.source_changed or active.parked
            )
            if active.control is None and not active.claim_lost and needs_recovery:
                how = result.outcome
                if result.exit_code == worker_memory.EXIT_OUT_OF_MEMORY:
                    how = f"ran out of memory ({worker_memory.ENV})"
                self._recover_worker_exit(active, how)
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
                try:
                    self._recover_worker_exit(active, "crashed")
                except DatabaseUnavailableError as unavailable:
                    # The run stays claimed until its claim expires; the claim after
                    # that resumes it.
                    log.warning("run %s left for its claim to expire: %s", run_id, unavailable)
        finally:
            slots.active_runs.pop(run_id, None)
            # A run whose own write released its claim freed its slot then, and the
            # commit of that write ran a claim pass that counted the slot free.
            if not active.released:
                slots.schedule_pass()

    async def _run_worker(self, active: ActiveRun, envelope: WorkerLaunchEnvelope) -> WorkerExit:
        settings = WorkerSettings(self.home.root, self.database_url, sys.executable)
        spec = plugins.worker_process(envelope, settings)
        gateway = WorkerGateway(
            active,
            self.slots,
            store=self.store,
            commits=self.commits,
            features=self.features,
            state_directory=self.home.host_dir,
            envelope=envelope,
        )
        # Only this package's worker reads what the host sends unasked (worker.ready's
        # answer with the launch, its fence times); a worker process of a plugin's own
        # keeps the round trip and is fenced by its claim alone.
        ours = is_worker_command(spec.argv)
        supervisor = WorkerSupervisor(
            spec,
            gateway.handle,
            startup_timeout_s=self.worker_startup_s,
            fence_at=self.lease_clock.fence_at if ours else None,
        )
        active.supervisor = supervisor
        # The pid is recorded with worker.ready (WorkerGateway), not in a commit of its own.
        # A run that never ran gets worker.ready's answer with the launch: it waits in the
        # pipe when the worker reads.
        prepared = gateway.prepare_ready if ours else None
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
        else:
            with self.store.transaction():
                record()
        plugins.worker_exited(
            active.run_id, result.outcome, result.exit_code, result.signal, at=stamp
        )

    def _recover_worker_exit(self, active: ActiveRun, outcome: str) -> None:
        """Exit recovery in the order of SPEC §7.4."""
        run_id, token = active.run_id, active.claim_token
        with self.store.transaction():
            if not run_claims.verify_claim(run_id, token, active.generation):
                return
            # Measured before effect recovery, which writes bookkeeping of its own.
            made_progress = run_poison.progress_mark(run_id) != active.progress
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
                        lambda: self.features.run_stopped(run_id, old_status, "failed")
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
