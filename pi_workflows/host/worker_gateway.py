"""The host side of the worker protocol: fencing, replay, revision checks (SPEC §7.2).

Order matters: a stale worker is answered `claimLost` before its payload is even
looked at; a repeated message id returns the stored response; only then does a store
operation check the run revision and the live claim, inside the transaction that
applies it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .. import plugins
from ..canonical import digest
from ..clock import now_ms
from ..engine.run_backend import OPERATIONS as BACKEND_OPERATIONS
from ..errors import (
    DatabaseUnavailableError,
    HostLeaseLostError,
    InvalidInputError,
    PiWorkflowsError,
    RevisionConflictError,
)
from ..protocol.framing import one_line_error
from ..protocol.worker_messages import (
    PREPARED_MESSAGE_ID,
    PREPARED_OUTCOME,
    PROCESS_OPERATIONS,
    WorkerOperation,
    validate_message,
    worker_response,
)
from ..storage import (
    put_json_in_parts,
    put_text,
    read_json,
    read_text,
    run_claims,
    run_processes,
    run_state,
    run_workers,
    statements,
)
from ..storage.database import is_disk_full
from ..storage.runs import current_revision, current_status, get_run, run_record
from . import lease_recovery
from .active_run import ActiveRun
from .process_groups import this_machine
from .process_identity import start_identity

if TYPE_CHECKING:
    from pathlib import Path

    from ..records import RunRecord, WorkerLaunchEnvelope
    from ..storage import StateStore
    from .commit_group import CommitGroup
    from .features import HostFeatures
    from .slots import WorkerSlots

log = logging.getLogger(__name__)

READ_ONLY_OPERATIONS = frozenset(
    {WorkerOperation.READ_RUN_STATE, WorkerOperation.READY, WorkerOperation.EXITING}
)


class _RunMoved(PiWorkflowsError):
    """A check held with a worker's write found the run other than that worker's last
    write left it (`WorkerGateway._claimed`): nothing of the write was written (in a
    group commit, its entry alone is undone, as for any refusal of ours)."""


class WorkerGateway:
    def __init__(
        self,
        active: ActiveRun,
        slots: WorkerSlots,
        *,
        store: StateStore,
        commits: CommitGroup,
        features: HostFeatures,
        state_directory: Path,
        envelope: WorkerLaunchEnvelope,
    ) -> None:
        self.active = active
        self.envelope = envelope
        self.slots = slots
        self.store = store
        self.commits = commits
        self.features = features
        self.state_directory = state_directory
        # Set while a store operation's transaction releases the run's claim.
        self._releases_claim = False
        # The run's status as the current store operation has left it (None: read it).
        self._status: str | None = None
        # worker.ready's answer when it went with the launch (`prepare_ready`).
        self._prepared: dict[str, Any] | None = None
        # The message ids whose replies this gateway recorded. The worker epoch is made
        # for this gateway's launch (`worker_lives`), so no other writer stores a reply
        # under it: a message id not here has none stored, and needs no look-up.
        self._recorded: set[str] = set()

    async def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """Answer one worker message; while the database is unreachable the worker waits
        for it (nothing it sent was written), so an outage costs it no work."""
        while True:
            try:
                return await self._handle(message)
            except DatabaseUnavailableError:
                if not await lease_recovery.wait_for_database(self.store, self._stopping):
                    return self._claim_lost(message["messageId"])
            except Exception as error:
                if not is_disk_full(error):
                    raise
                # Nothing was written: the worker waits until the write fits.
                if not await lease_recovery.wait_for_room(self._stopping):
                    return self._claim_lost(message["messageId"])

    def _stopping(self) -> bool:
        return self.slots.is_closed

    async def _handle(self, message: dict[str, Any]) -> dict[str, Any]:
        # A client streaming run.starts goes first (bounded; see host/commit_group.py).
        await self.commits.worker_turn()
        validate_message(message)
        message_id = message["messageId"]
        active = self.active
        if active.claim_lost:  # fenced (a lost claim or host lease): it writes nothing
            return self._claim_lost(message_id)
        if (
            self.slots.active_runs.get(message["runId"]) is not active
            or message["generation"] != active.generation
            or message["workerEpoch"] != active.worker_epoch
        ):
            if active.supervisor is not None:
                active.supervisor.note("Worker epoch is stale")
            return worker_response(message_id, "claimLost", error="Worker epoch is stale")
        if message["operation"] in READ_ONLY_OPERATIONS:
            # A read changes nothing: no transaction, no fsync, no replay record (asking
            # again gives the same answer). worker.ready's bookkeeping waits for the next
            # commit (`_record_ready`), unless a store read comes first: that read must
            # see the revision worker.ready promised.
            if message["operation"] != WorkerOperation.READY and active.ready == "deferred":
                self.store.flush_deferred()
            try:
                return self._dispatch(message)
            except DatabaseUnavailableError:
                raise
            except PiWorkflowsError as error:
                return worker_response(message_id, "rejected", error=one_line_error(error))
        fingerprint = digest(message)
        stored = None
        if message_id in self._recorded:  # sent again: its stored reply, if it committed
            stored = statements.worker_message(active.worker_epoch, message_id)
        if stored is not None:
            stored_fingerprint, _, revision, result_hash, error_hash = stored
            if stored_fingerprint != fingerprint:
                return worker_response(
                    message_id,
                    "rejected",
                    error="Worker message ID was reused with another payload",
                )
            return worker_response(
                message_id,
                "adopted",
                result=read_json(result_hash),
                error=read_text(error_hash),
                revision=revision,
            )

        # The operation and its stored response commit together (one fsync, and a
        # replay can never see an applied operation without its response).
        status = self._status

        def apply() -> dict[str, Any]:
            self._status = status  # applied again (its group went again): as at first
            reply = self._dispatch(message)
            self._record(message, fingerprint, reply)
            return reply

        try:
            # Writes of other workers read in the same loop pass share this commit.
            try:
                reply = await self.commits.submit(apply)
            except _RunMoved:
                status = None  # then `_claimed` reads
                reply = await self.commits.submit(apply)
        except HostLeaseLostError:
            return self._claim_lost(message_id)  # this host's lease is gone: no write at all
        except DatabaseUnavailableError:
            raise
        except PiWorkflowsError as error:
            revision = current_revision(active.run_id)
            reply = worker_response(
                message_id, "rejected", error=one_line_error(error), revision=revision
            )
            self._record(message, fingerprint, reply)
        return reply

    def _dispatch(self, message: dict[str, Any]) -> dict[str, Any]:
        operation = message["operation"]
        if operation == WorkerOperation.READY:
            return self._ready(message)
        if operation == WorkerOperation.EXITING:
            return self._exiting(message)
        if operation in PROCESS_OPERATIONS:
            return self._process_operation(message)
        return self._store_operation(message)

    def _record(self, message: dict[str, Any], fingerprint: str, reply: dict[str, Any]) -> None:
        self._recorded.add(message["messageId"])
        with self.store.transaction():
            statements.insert_worker_message(
                self.active.worker_epoch,
                message["messageId"],
                fingerprint,
                reply["outcome"],
                reply.get("revision"),
                put_json_in_parts(reply["result"]) if "result" in reply else None,
                put_text(reply["error"]) if "error" in reply else None,
                now_ms(),
            )

    def _claim_lost(self, message_id: str) -> dict[str, Any]:
        if self.active.supervisor is not None:
            self.active.supervisor.note("Run claim expired")
        self.active.claim_lost = True
        self.active.stop("claimLost")
        return worker_response(message_id, "claimLost", error="Run claim expired")

    def prepare_ready(self) -> dict[str, Any] | None:
        """worker.ready's answer for a run that never ran, sent with the launch.

        The worker reads it as soon as it has loaded the workflow and goes on to its first
        write without waiting for the reply to its worker.ready. That first write is
        claim-fenced and comes before any node code runs, so an answer prepared too early
        runs nothing, and a claim lost meanwhile stops the worker there (worker.ready is
        not checked again). Other runs (resume, restart, continue) are answered, after a
        check of the claim, at worker.ready (None here).
        """
        active = self.active
        record, active.claimed = active.claimed or run_record(active.run_id), None
        if record.is_initialized or record.lineage_kind or record.parent_run_id:
            return None
        # It has no snapshot yet: its state is what the host holds of it already.
        source, digest = self.envelope["workflowSource"], self.envelope["definitionDigest"]
        state = run_state.unstarted_run_state(record, source, digest)
        try:
            answer = self._ready_answer(record, state)
        except PiWorkflowsError:
            return None  # worker.ready asks the hook again and refuses the launch
        self._prepared = answer
        self._status = record.status  # what the worker's first write checks it finds
        return worker_response(PREPARED_MESSAGE_ID, PREPARED_OUTCOME, **answer)

    def _ready(self, message: dict[str, Any]) -> dict[str, Any]:
        active, message_id = self.active, message["messageId"]
        # An answer sent with the launch leaves the claim to the worker's first write.
        if self._prepared is None and not run_claims.verify_claim(
            active.run_id, active.claim_token, active.generation
        ):
            return self._claim_lost(message_id)
        # The worker's pid and the queue's `running` are bookkeeping: they ride on the
        # next commit, at the latest the worker's first write, which comes before any
        # node code runs (and before any process group it could start). The worker is
        # told the revision that write finds: `mark_running` bumps it once.
        if active.ready is None:
            active.ready = "deferred"
            self.store.defer_write(self._record_ready)
        if active.supervisor is not None:
            active.supervisor.ready.set()
        if self._prepared is not None:  # the answer went with the launch
            return worker_response(message_id, "accepted", revision=self._prepared["revision"])
        try:
            answer = self._ready_answer(run_record(active.run_id))
        except PiWorkflowsError as error:
            cause = error.__cause__ if isinstance(error.__cause__, ValueError) else error
            active.launch_failure = f"Workflow worker launch refused: {cause}"
            if active.supervisor is not None:
                active.supervisor.note(f"worker launch refused: {cause}")
            active.stop("crashed")
            return worker_response(message_id, "rejected", error=one_line_error(cause))
        return worker_response(message_id, "accepted", **answer)

    def _ready_answer(
        self, record: RunRecord, state: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The run command (`piw_worker_run_command`) and the engine's first reads, with
        the revision the worker's first write finds (`result`, `revision`). `state`: the
        run's state when the caller holds it (else read)."""
        active = self.active
        timed_out = run_state.timed_out_interaction_attempt(active.run_id, record.status)
        command = plugins.worker_run_command(record, timed_out)
        # The engine's first read, answered now so that it costs no message.
        if state is None:
            state = run_state.read_run_state(active.run_id)
        result = {
            "command": command.to_json(),
            "originSessionId": record.origin_session_id,
            "runState": state,
            "stateDirectory": str(self.state_directory),
            "workflowName": state["workflowName"],
        }
        if result["command"].get("kind") == "continue":
            # A continuation's engine reads its parked parent next: answered now too.
            parent = result["command"]["parentRunId"]
            result["parentRunState"] = run_state.read_run_state(parent)
        # `mark_running` (worker.ready's deferred bookkeeping) bumps the revision once.
        revision = record.revision + (1 if active.ready in (None, "deferred") else 0)
        return {"result": result, "revision": revision}

    def _record_ready(self) -> None:
        # Deferred once per worker (`_ready`), and run again only after a rollback undid
        # it; the worker's row is `starting` until then (its end is written after this).
        active = self.active
        pid = active.supervisor.pid if active.supervisor is not None else None
        run_workers.mark_running(active.worker_epoch, pid, start_identity(pid) if pid else None)
        never_ran = active.progress.run_status == "queued"
        run_claims.mark_running(
            active.run_id, active.claim_token, active.generation, never_ran=never_ran
        )
        self.store.after_commit(lambda: setattr(active, "ready", "recorded"))

    def _exiting(self, message: dict[str, Any]) -> dict[str, Any]:
        self._note_exiting(message["payload"])
        return worker_response(message["messageId"], "accepted", result={})

    def _note_exiting(self, payload: dict[str, Any]) -> None:
        """The worker's goodbye: why it stops (worker.exiting, or its last write's)."""
        status, error = payload.get("status"), payload.get("error")
        if status == "workflowLoadFailed":
            self.active.workflow_load_failure = str(error or "Workflow failed to load")[:8192]
        elif status == "workflowSourceChanged":
            self.active.source_changed = str(error or "Workflow source changed")[:8192]
        elif status == "parked":
            self.active.parked = True
        self.active.exiting = True
        if self.active.supervisor is not None:
            self.active.supervisor.saw_exiting = True

    def _process_operation(self, message: dict[str, Any]) -> dict[str, Any]:
        """`process.register` / `process.unregister` of a group the worker starts."""
        active, message_id, payload = self.active, message["messageId"], message["payload"]
        if not run_claims.verify_claim(active.run_id, active.claim_token, active.generation):
            return self._claim_lost(message_id)
        group = payload.get("processGroup")
        if type(group) is not int or group <= 1:
            raise InvalidInputError("processGroup must be the id of the worker's child group")
        if message["operation"] == WorkerOperation.UNREGISTER_PROCESS:
            run_processes.unregister_group(active.worker_epoch, group)
            return worker_response(message_id, "accepted", result={})
        # The host reads the start identity itself: the group leader waits at its gate.
        identity = start_identity(group)
        if identity is None:
            raise InvalidInputError(f"Process group {group} is not running; nothing to register")
        active.registered_groups = True
        run_processes.register_group(
            active.run_id,
            active.worker_epoch,
            group,
            identity,
            this_machine(),
            str(payload.get("kind")),
        )
        return worker_response(message_id, "accepted", result={})

    def _store_operation(self, message: dict[str, Any]) -> dict[str, Any]:
        active, message_id = self.active, message["messageId"]
        operation, payload = WorkerOperation(message["operation"]), message["payload"]
        self._releases_claim = False
        # The claim first: a lost claim also leaves worker.ready's revision bump unmade.
        claimed = self._claimed(message["expectedRevision"])
        if claimed is None:
            return self._claim_lost(message_id)
        revision, self._status = claimed
        if message["expectedRevision"] != revision:
            raise RevisionConflictError(
                f"Workflow run revision conflict: expected {message['expectedRevision']}, "
                f"got {revision}"
            )
        if operation == WorkerOperation.BATCH:
            # One transaction for a durable boundary: the steps apply in order, each
            # bumping the revision as if it had come alone.
            results = [
                self._apply_write(WorkerOperation(step["operation"]), step["payload"])
                for step in payload["steps"]
            ]
            result: Any = {"results": results}
            goodbye = payload.get("exiting")
            if goodbye is not None:  # the worker's goodbye rode on its last write
                self.store.after_commit(lambda: self._note_exiting(goodbye))
        else:
            result = self._apply_write(operation, payload)
        if self._releases_claim:
            # The commit that frees this worker's slot also claims the run waiting for it.
            self.commits.claim_at_end(freed=active)
        return worker_response(
            message_id, "accepted", result=result, revision=current_revision(active.run_id)
        )

    def _claimed(self, expected_revision: int) -> tuple[int, str] | None:
        """The run's revision and status while this worker's claim is live, its row held
        to the end of the transaction; None when the claim is lost.

        Where the host knows the status this worker's writes left (`_status`), a check
        that the run is still there, at the revision the worker expects, travels with the
        write's next statement instead of a read of its own (PostgreSQL). When the check
        fails nothing of the write is written, and `_handle` applies it again with the
        read, which says what changed."""
        active = self.active
        status = self._status
        if status is not None and run_claims.hold_claimed_run_check(
            active.run_id,
            active.claim_token,
            active.generation,
            (expected_revision, status),
            _RunMoved,
        ):
            return expected_revision, status
        return run_claims.claimed_run(active.run_id, active.claim_token, active.generation)

    def _apply_write(self, operation: WorkerOperation, payload: dict[str, Any]) -> Any:
        active = self.active
        if operation != WorkerOperation.WRITE_SNAPSHOT:
            self._status = None  # what other operations do to the status is not tracked
            result = self._apply(operation, payload)
            self.features.worker_operation(operation, active.run_id, payload, result)
            return result
        old_status = self._status if self._status is not None else current_status(active.run_id)
        result = self._apply(operation, payload)
        self.features.worker_operation(operation, active.run_id, payload, result)
        new_status = self._status = payload["snapshot"]["status"]
        if new_status != "running":
            run_claims.project_lifecycle(active.run_id, active.generation, new_status)
            self._releases_claim = True
            self.store.after_commit(lambda: setattr(active, "released", True))
            self.store.after_commit(
                lambda: self.features.run_stopped(active.run_id, old_status, new_status)
            )
        return result

    def _apply(self, operation: WorkerOperation, payload: dict[str, Any]) -> Any:
        """Forward to the state-store function the engine's local store also uses."""
        function = getattr(run_state, BACKEND_OPERATIONS[operation])
        if operation == WorkerOperation.READ_RUN_STATE:
            # A continuation reads its parent; any other run id is out of bounds.
            wanted = payload.get("run_id") or self.active.run_id
            if wanted not in (self.active.run_id, get_run(self.active.run_id).parent_run_id):
                raise PiWorkflowsError("A worker may read only its run and that run's parent.")
            return function(wanted)
        return function(self.active.run_id, **payload)
