"""Client operations: what each request does to runs, claims and workers (SPEC §8).

Durable operations run inside `execute_durable`, so their change and their receipt
commit together; effects that must follow the commit (activating or stopping a
worker) are registered with `store.after_commit`.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from .. import plugins
from ..clock import now_ms
from ..errors import DatabaseUnavailableError, InvalidInputError, PiWorkflowsError
from ..event_types import EventType
from ..limits import MAX_INPUT_BYTES, checked_json
from ..protocol.client_messages import ClientRequest, response
from ..protocol.framing import one_line_error, valid_id
from ..storage import (
    decision_resolutions,
    effects,
    host_leases,
    read_json,
    record_run_change,
    run_claims,
)
from ..storage.host_status import HostState, host_status_counts
from ..storage.run_graph import run_graph, store_definition
from ..storage.run_operations import RUN_STATUSES, park_queued_run
from ..storage.run_rows import Run, lease_row
from ..storage.run_statuses import is_terminal_status
from ..storage.runs import create_run, get_run, new_run_id, run_status, run_statuses
from ..storage.sessions import unfinished_session_run
from ..storage.transcripts import attempt_transcripts
from . import forwarded_commands
from .receipts import (
    OperationResult,
    StoredAlready,
    apply_durable,
    execute_durable,
    outcome_for_error,
    refusal,
)

# `run.startBatch`: at most this many runs per request (and one frame, at most 1 MiB).
MAX_BATCH_RUNS = 1000

if TYPE_CHECKING:
    from ..storage import StateStore
    from .commit_group import CommitGroup
    from .slots import WorkerSlots

RUN_LIST_LIMIT = 100
# A 32-bit column on every database.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1

DurableHandler = Callable[[ClientRequest], OperationResult]
QueryHandler = Callable[[ClientRequest], Any]
# Live operations belong to one connection (views, turn reports); they answer themselves.
LiveHandler = Callable[[ClientRequest, Any], Awaitable[dict[str, Any]]]
DurableWrapper = Callable[..., OperationResult]  # (request, *, proceed) -> OperationResult
LiveWrapper = Callable[..., Awaitable[dict[str, Any]]]  # (request, connection, *, proceed)


class OperationTable:
    """Operation name → handler; host features add theirs through `register_*`.

    `wrap_durable(name, wrapper)` decorates another feature's durable operation:
    ``wrapper(request, proceed)`` decides whether to call ``proceed(request)``;
    `wrap_live(name, wrapper)` does the same for a live one (``await
    wrapper(request, connection, proceed=...)``). Wrappers are composed when the
    operation is called, so registration order never matters; the last registered
    wrapper runs outermost.
    """

    def __init__(self) -> None:
        self.durable: dict[str, DurableHandler] = {}
        self.queries: dict[str, QueryHandler] = {}
        self.live: dict[str, LiveHandler] = {}
        self.durable_wrappers: dict[str, list[DurableWrapper]] = {}
        self.live_wrappers: dict[str, list[LiveWrapper]] = {}

    def register_durable(self, operation: str, handler: DurableHandler) -> None:
        """A command whose change and receipt commit together (adopted on repeat)."""
        self.durable[operation] = handler

    def register_query(self, operation: str, handler: QueryHandler) -> None:
        self.queries[operation] = handler

    def register_live(self, operation: str, handler: LiveHandler) -> None:
        self.live[operation] = handler

    def wrap_durable(self, operation: str, wrapper: DurableWrapper) -> None:
        self.durable_wrappers.setdefault(operation, []).append(wrapper)

    def wrap_live(self, operation: str, wrapper: LiveWrapper) -> None:
        self.live_wrappers.setdefault(operation, []).append(wrapper)

    def live_handler(self, operation: str) -> LiveHandler:
        handler = self.live[operation]
        for wrapper in self.live_wrappers.get(operation, ()):
            handler = functools.partial(wrapper, proceed=handler)
        return handler

    def durable_handler(self, operation: str) -> DurableHandler:
        handler = self.durable[operation]
        for wrapper in self.durable_wrappers.get(operation, ()):
            handler = functools.partial(wrapper, proceed=handler)
        return handler

    @property
    def known(self) -> frozenset[str]:
        return frozenset({*self.durable, *self.queries, *self.live, "host.stop"})


class HostControl(Protocol):
    """What the client operations need of the host besides its worker slots."""

    store: StateStore
    worker_commits: CommitGroup

    def serving_epoch(self) -> int | None:
        """The epoch clients are served under; None while the host starts or stops."""

    def request_stop(self) -> None:
        """`host.stop`: stop soon (after this answer)."""

    def after_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        """After commit: a run left `running` (features react)."""

    def status_facts(self) -> dict[str, Any]:
        """`host status`'s facts of the host process (socket, epoch, uptime, clients,
        features' fields, profile, duty), in the order it shows them."""


class Operations:
    """The host's own run operations and the dispatcher over the operation table."""

    def __init__(self, slots: WorkerSlots, host: HostControl) -> None:
        self.slots = slots
        self.host = host
        self.table = OperationTable()
        for name, durable in (
            ("run.start", self.run_start),
            ("run.startBatch", self.run_start_batch),
            ("run.pause", self.run_pause),
            ("run.resume", self.run_resume),
            ("run.cancel", self.run_cancel),
        ):
            self.table.register_durable(name, durable)
        for name, query in (
            ("run.status", self.run_status),
            ("run.graph", self.run_graph),
            ("run.transcript", self.run_transcript),
            ("run.list", self.run_list),
            ("host.status", self.host_status),
        ):
            self.table.register_query(name, query)
        self.table.register_live("content.read", self.content_read)

    @property
    def known(self) -> frozenset[str]:
        return self.table.known

    async def dispatch(self, request: ClientRequest, connection: Any = None) -> dict[str, Any]:
        host = self.host
        epoch = host.serving_epoch()
        if epoch is None:
            return response(request.request_id, "unavailable", error="Workflow host is stopping")
        operation = request.operation
        table = self.table
        if operation in table.live:
            try:
                return await table.live_handler(operation)(request, connection)
            except PiWorkflowsError as error:
                return response(
                    request.request_id, outcome_for_error(error), error=one_line_error(error)
                )
        if operation in table.durable:
            handler = table.durable_handler(operation)
            return execute_durable(host.store, request, epoch, lambda: handler(request))
        if operation == "host.stop":
            host.request_stop()
            return response(request.request_id, "accepted", receipt={"stopping": True})
        try:
            receipt = table.queries[operation](request)
        except PiWorkflowsError as error:
            return response(
                request.request_id, outcome_for_error(error), error=one_line_error(error)
            )
        return response(request.request_id, "accepted", receipt=receipt)

    async def content_read(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        """One chunk of a value an earlier answer on this connection referenced."""
        return response(
            request.request_id, "accepted", receipt=connection.content.read(request.payload)
        )

    # --- runs --------------------------------------------------------------------------

    def commit_starts(self, requests: list[ClientRequest]) -> list[dict[str, Any] | Exception]:
        """`run.start`s read together: they join the host's commit group (with the worker
        writes read in the same loop pass) and commit it now, one fsync for all; each is
        refused, or fails, alone. Each answer is the one `dispatch` would give, or the
        exception that request raised."""
        host = self.host
        epoch = host.serving_epoch()
        if epoch is None:
            return [
                response(r.request_id, "unavailable", error="Workflow host is stopping")
                for r in requests
            ]
        handler = self.table.durable_handler("run.start")
        group = host.worker_commits

        def start(request: ClientRequest, *, held: bool) -> asyncio.Future[Any]:
            operation = functools.partial(handler, request)
            apply = functools.partial(apply_durable, request, epoch, operation, held=held)
            return group.submit(apply, contained=True)

        futures = [start(request, held=True) for request in requests]
        group.commit_now()  # resolves every future
        # A start stored already (a client's retry) found so: applied again with the read.
        again = [i for i, f in enumerate(futures) if isinstance(f.exception(), StoredAlready)]
        if again:
            for index in again:
                futures[index] = start(requests[index], held=False)
            group.commit_now()
        answers: list[dict[str, Any] | Exception] = []
        for request, future in zip(requests, futures, strict=True):
            error = future.exception()
            if error is None:
                answers.append(future.result())
            elif isinstance(error, PiWorkflowsError):
                answers.append(refusal(request, error))
            else:  # answered like any failed request
                assert isinstance(error, Exception)
                answers.append(error)
        return answers

    def run_start(self, request: ClientRequest) -> OperationResult:
        created = self._create_run(request.payload, request.client_id)
        if isinstance(created, OperationResult):
            return created
        # Claimed by this commit when a worker slot is free (one pass per commit group).
        self.host.worker_commits.claim_at_end()
        return OperationResult(
            "accepted", receipt={"runId": created, "status": "queued"}, revision=1, run_id=created
        )

    def run_start_batch(self, request: ClientRequest) -> OperationResult:
        """`run.startBatch {runs: [run.start payload, ...]}`: all of them in one commit, or
        none (the first refused one names its index)."""
        runs = request.payload.get("runs")
        if not isinstance(runs, list) or not 0 < len(runs) <= MAX_BATCH_RUNS:
            raise InvalidInputError(
                f"runs must be a list of 1 to {MAX_BATCH_RUNS} run.start payloads"
            )
        run_ids = []
        for index, payload in enumerate(runs):
            try:
                if not isinstance(payload, dict):
                    raise InvalidInputError("each run must be a JSON object")
                created = self._create_run(payload, request.client_id)
            except PiWorkflowsError as error:
                raise InvalidInputError(f"runs[{index}]: {error}") from error
            if isinstance(created, OperationResult):
                raise InvalidInputError(f"runs[{index}]: {created.error}")
            run_ids.append(created)
        self.slots.claim_free_slots()
        return OperationResult(
            "accepted", receipt={"runs": [{"runId": r, "status": "queued"} for r in run_ids]}
        )

    def _create_run(self, payload: dict[str, Any], client_id: str) -> str | OperationResult:
        """Check one `run.start` payload and create its run; its id, or the refusal."""
        name = _text(payload, "workflowName")
        project = _text(payload, "projectPath")
        if not os.path.isabs(project):
            raise InvalidInputError(f"projectPath must be absolute, got {project!r}")
        source = payload.get("workflowSource")
        if not isinstance(source, dict) or source.get("kind") not in ("file", "builtin", "plugin"):
            raise InvalidInputError("workflowSource must be a file, builtin or plugin source")
        mode = payload.get("executionMode", "headless")
        if mode not in ("headless", "interactive"):
            raise InvalidInputError("executionMode must be 'headless' or 'interactive'")
        session = payload.get("originSessionId")
        if mode == "interactive":
            if not valid_id(session):
                raise InvalidInputError("An interactive run needs an originSessionId")
            holder = unfinished_session_run(session)
            if holder is not None:
                return OperationResult(
                    "rejected",
                    error=f"This session already has an unfinished workflow run ({holder.run_id}); "
                    "wait for it to finish or cancel it before starting another.",
                )
        prompt = payload.get("presentationPrompt")
        run_input = payload.get("input", {})
        checked_json(run_input, "The run's input", MAX_INPUT_BYTES)
        priority = payload.get("priority", 0)
        if type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise InvalidInputError(
                f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}"
            )
        definition_digest = _text(payload, "definitionDigest")
        snapshot = payload.get("definitionSnapshot")
        if snapshot is not None:  # optional: a run started without it has no graph to show
            store_definition(snapshot, definition_digest)
        run_id = new_run_id(name)
        create_run(
            run_id=run_id,
            workflow_name=name,
            workflow_ref=_text(payload, "workflowRef"),
            workflow_source=source,
            definition_digest=definition_digest,
            project_path=project,
            input=run_input,
            actor=f"client:{client_id}",
            execution_mode=mode,
            origin_session_id=session if mode == "interactive" else None,
            presentation_prompt=prompt if isinstance(prompt, str) else None,
            priority=priority,
        )
        return run_id

    def run_status(self, request: ClientRequest) -> dict[str, Any]:
        return run_status(request.target_run_id())

    def run_graph(self, request: ClientRequest) -> dict[str, Any]:
        return run_graph(request.target_run_id())

    def run_transcript(self, request: ClientRequest) -> list[dict[str, Any]]:
        node_id = request.payload.get("nodeId")
        if node_id is not None and not valid_id(node_id):
            raise InvalidInputError("nodeId must be non-empty text of at most 256 bytes")
        return attempt_transcripts(request.target_run_id(), node_id)

    def run_list(self, request: ClientRequest) -> list[dict[str, Any]]:
        payload = request.payload
        limit = payload.get("limit", RUN_LIST_LIMIT)
        if type(limit) is not int or not 0 < limit <= 1000:
            raise InvalidInputError("limit must be an integer between 1 and 1000")
        before, status, workflow = (payload.get(key) for key in ("before", "status", "workflow"))
        if before is not None and not valid_id(before):
            raise InvalidInputError("before must be the id of the last run of the page before")
        if status is not None and status not in RUN_STATUSES:
            raise InvalidInputError(f"status must be one of {', '.join(RUN_STATUSES)}")
        if workflow is not None and not valid_id(workflow):
            raise InvalidInputError("workflow must be a workflow name")
        return run_statuses(limit, before=before, status=status, workflow=workflow)

    def run_cancel(self, request: ClientRequest) -> OperationResult:
        run_id = request.target_run_id()
        run = get_run(run_id)
        host = self.host
        if is_terminal_status(run.status):
            # Checked before the slots: a cancelled run's worker may still be exiting, and
            # its spent claim token must not turn a repeat into "claim lost".
            return OperationResult("rejected", error="Run is already terminal", run_id=run_id)
        if forwarded_commands.owned_elsewhere(self.slots, run_id):
            return forwarded_commands.forward(request, run_id)
        slots = self.slots
        active = slots.active_runs.get(run_id)
        token = active.claim_token if active else slots.pending_claims.get(run_id)
        if active is not None and (active.control in ("pause", "handoff") or active.released):
            # Parked or waiting already, its claim released: the exiting worker owns nothing.
            token = None
        if not run_claims.terminate_run(
            run_id, token, status="cancelled", code="cancelled", error="Workflow run cancelled"
        ):
            if is_terminal_status(get_run(run_id).status):
                # Its worker finished it between the read above and the fenced write.
                return OperationResult("rejected", error="Run is already terminal", run_id=run_id)
            if token is not None:
                return OperationResult(
                    "claimLost", error="Run claim was lost before cancellation", run_id=run_id
                )
            return OperationResult(
                "rejected", error="Run has a live owner or is already terminal", run_id=run_id
            )
        if active is not None:
            active.control = "cancel"
            host.store.after_commit(lambda: active.stop("cancelled"))
        else:
            slots.pending_claims.pop(run_id, None)
        old_status = run.status
        host.store.after_commit(lambda: host.after_run_stopped(run_id, old_status, "cancelled"))
        return OperationResult(
            "accepted",
            receipt={"runId": run_id, "status": "cancelled"},
            revision=get_run(run_id).revision,
            run_id=run_id,
        )

    def run_pause(self, request: ClientRequest) -> OperationResult:
        run_id = request.target_run_id()
        run = get_run(run_id)
        host = self.host
        receipt = {"runId": run_id, "status": "parked", "paused": True}
        if is_terminal_status(run.status):
            return OperationResult("rejected", error="Run is already terminal", run_id=run_id)
        if run.paused:
            return OperationResult(
                "adopted", receipt={**receipt, "alreadyPaused": True}, run_id=run_id
            )
        if forwarded_commands.owned_elsewhere(self.slots, run_id):
            return forwarded_commands.forward(request, run_id)
        slots = self.slots
        active = slots.active_runs.get(run_id)
        if active is not None and (active.released or active.control == "pause"):
            # Its claim is released (by its worker's own write: the run waits for an answer;
            # or by a pause a resume undid) and the worker is on its way out: pause the run
            # as one with no worker, as cancel does.
            active = None
        if active is not None and active.control is not None:
            return OperationResult(
                "rejected", error=f"Run is already handling {active.control}", run_id=run_id
            )
        token = active.claim_token if active else slots.pending_claims.get(run_id)
        if token is not None:
            if not run_claims.park_run(run_id, token):
                return OperationResult(
                    "claimLost", error="Run claim was lost before pause committed", run_id=run_id
                )
            if active is not None:
                active.control = "pause"
                host.store.after_commit(lambda: active.stop("cancelled"))
                detail = "The run is durably paused; the supervised worker is stopping."
            else:
                slots.pending_claims.pop(run_id, None)
                detail = "The run was paused before its worker started."
        else:
            if lease_row(run_id).is_live(now_ms()):
                return OperationResult("rejected", error="Run is not pausable", run_id=run_id)
            park_queued_run(run_id)
            detail = "The run is durably paused."
        revision = record_run_change(
            run_id,
            event_type=EventType.RUN_PAUSED,
            actor=f"client:{request.client_id}",
            payload={"status": "parked"},
            paused=True,
            status_detail="paused",
        )
        return OperationResult(
            "accepted",
            receipt={**receipt, "alreadyPaused": False, "detail": detail},
            revision=revision,
            run_id=run_id,
        )

    def run_resume(self, request: ClientRequest) -> OperationResult:
        run_id = request.target_run_id()
        run = get_run(run_id)
        host = self.host
        slots = self.slots
        active = slots.active_runs.get(run_id)
        # A pause released the claim and is still stopping the worker: the resume holds,
        # and the claim pass takes the run once that worker has exited.
        stopping = run.paused and active is not None and active.control == "pause"
        # The worker's own write released its claim (the run waits or ended): it owns
        # nothing and is only exiting, as `run_pause` and `run_cancel` treat it.
        exiting = active is not None and active.released
        busy = slots.is_busy(run_id) and not (stopping or exiting)
        if busy or forwarded_commands.owned_elsewhere(self.slots, run_id):
            return OperationResult(
                "adopted",
                receipt={
                    "runId": run_id,
                    "alreadyRunning": True,
                    "detail": "The workflow is already running.",
                },
                run_id=run_id,
            )
        if is_terminal_status(run.status):
            return OperationResult("rejected", error="Run is already terminal", run_id=run_id)
        in_doubt = effects.ambiguous_effect_ids(run_id)
        if in_doubt:
            return OperationResult(
                "rejected",
                error=f"Run waits for an operator: {effects.ambiguous_detail(in_doubt)}",
                run_id=run_id,
            )
        if run.status == "waiting":
            if run.paused:
                return self._unpause_waiting(request, run)
            return OperationResult(
                "rejected",
                error="Run is waiting for input; answer its checkpoint or decision instead",
                run_id=run_id,
            )
        if run.paused:
            record_run_change(
                run_id,
                event_type=EventType.RUN_RESUMED,
                actor=f"client:{request.client_id}",
                payload={"status": run.status},
                paused=False,
                status_detail=None,
            )
        # The claim gate: a free slot, the claim plugins, the fenced claim; the worker
        # launches after this commit.
        answer = None if stopping else slots.claim_run(run_id)
        if answer is not None and answer.generation is not None:
            return OperationResult(
                "accepted",
                receipt={
                    "runId": run_id,
                    "generation": answer.generation,
                    "detail": "The parked workflow was claimed for supervised execution.",
                },
                revision=get_run(run_id).revision,
                run_id=run_id,
            )
        if answer is not None and answer.refusal == "taken":
            return OperationResult("rejected", error="Run is not resumable", run_id=run_id)
        # Back in the queue: the claim pass takes it when a slot is free and the claim
        # plugins allow it (they are never asked inside this transaction).
        run_claims.release_hold(run_id)

        def requeued() -> None:
            slots.blocked_runs.discard(run_id)
            slots.schedule_pass()

        host.store.after_commit(requeued)
        if answer is None:
            detail = "The run is queued; it runs again once its paused worker has stopped."
        elif answer.refusal == "full":
            detail = (
                f"The run is queued; it waits for a free worker slot "
                f"({slots.busy()} of {slots.max_workers} busy)."
            )
        else:
            detail = "The run is queued; the claim plugins decide at the next claim pass."
        return OperationResult(
            "accepted",
            receipt={"runId": run_id, "queued": True, "detail": detail},
            revision=get_run(run_id).revision,
            run_id=run_id,
        )

    def _unpause_waiting(self, request: ClientRequest, run: Run) -> OperationResult:
        """Resume a run paused at its checkpoint or decision: it has no worker to start;
        it takes answers again, and its decision deadlines get the paused time back."""
        decision_resolutions.give_back_pause(run.run_id, now_ms())
        state = read_json(run.state_hash) if run.state_hash is not None else None
        revision = record_run_change(
            run.run_id,
            event_type=EventType.RUN_RESUMED,
            actor=f"client:{request.client_id}",
            payload={"status": "waiting"},
            paused=False,
            status_detail=state.get("statusDetail") if isinstance(state, dict) else None,
        )
        return OperationResult(
            "accepted",
            receipt={
                "runId": run.run_id,
                "status": "parked",
                "paused": False,
                "waitingForAnswer": True,
                "detail": "The run waits for the answer to its checkpoint or decision again.",
            },
            revision=revision,
            run_id=run.run_id,
        )

    # --- host --------------------------------------------------------------------------

    def host_status(self, request: ClientRequest) -> dict[str, Any]:
        host = self.host
        facts = host.status_facts()
        own = {
            # No pid or start identity: the receipt may reach a model through a session;
            # the CLI reads the process from the home's lock file.
            "socketAvailable": facts.pop("socketAvailable"),
            "epoch": facts.pop("epoch"),
            "uptimeMs": facts.pop("uptimeMs"),
            "activeWorkers": len(self.slots.active_runs),
            "maxWorkers": self.slots.max_workers,
            "connectedClients": facts.pop("connectedClients"),
            # The state database's connections this host holds, by purpose.
            "databaseConnections": host.store.connection_use.counts(),
            "claimPassFailure": self.slots.failure(),
            # Plugins past the hook deadline in a launch, turn or terminal-message hook.
            "hungPlugins": sorted(plugins.hung_plugins().values()),
            **facts,  # the features', the profile and the duty
        }
        try:
            if host.store.unavailable:  # a deleted SQLite file still reads, but stale
                raise DatabaseUnavailableError(host.store.unavailable)
            counts = host_status_counts()
            hosts = [_host_record(row, self.slots.host_id) for row in host_leases.live_hosts()]
        except DatabaseUnavailableError:
            # What the host knows without its database, and why the rest is missing.
            unavailable = host.store.unavailable
            return {"state": "databaseUnavailable", "databaseUnavailable": unavailable, **own}
        return {"state": "running", "databaseUnavailable": None, **own, **counts, "hosts": hosts}


def _host_record(row: HostState, own_host_id: str) -> dict[str, Any]:
    """A live host of the database as `host status --json` lists it (SPEC §14)."""
    return {
        "hostId": row.host_id,
        "epoch": row.epoch,
        "machine": row.machine,
        "pid": row.pid,
        "socketAddress": row.socket_address,
        "startedAt": row.started_at,
        "heartbeatAt": row.heartbeat_at,
        "leaseExpiresAt": row.expires_at,
        "self": row.host_id == own_host_id,
    }


def _text(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"payload.{key} must be a non-empty string")
    return value
