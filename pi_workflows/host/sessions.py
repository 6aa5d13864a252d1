"""Sessions: coordinators, live session views, branch and turn reports, submissions (SPEC §9).

Coordinator state lives in host memory for one host epoch: a session's coordinator is
the connection that last asked for it, identified by a random epoch; a newer one fences
the older one, and closing the connection ends it. Everything durable (messages, turns,
requests, submissions) is in the database, so a session that reconnects to a new host
picks up where it was by reporting its branch again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .. import plugins
from ..canonical import digest
from ..clock import now_ms
from ..errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PiWorkflowsError,
    PluginError,
    RunStillOwnedError,
    TurnConflictError,
)
from ..event_types import EventType
from ..protocol.client_messages import SCHEMA, ClientRequest, response
from ..protocol.framing import valid_id
from ..protocol.worker_messages import WorkerOperation
from ..records import TurnReceipt, TurnReport
from ..storage import put_json, read_json, record_run_change, run_state, step_deadlines
from ..storage.interactions import (
    InteractiveRequest,
    InteractiveSubmission,
    bump_request_revision,
    cancel_request,
    find_request,
    get_request,
    get_submission,
    is_validating,
    pending_step_request_of_run,
    record_validating_submission,
    reject_validating_submission,
    reject_validating_submissions_of,
    submission_for,
    validating_submissions,
)
from ..storage.run_rows import find_run_row, lease_row, run_row
from ..storage.sessions import is_constraint_violation, messages_for_source, pending_step_requests
from ..storage.turns import STOP_REASONS, open_turns_for_session
from ..storage.workflow_messages import (
    adopt_branch,
    cancel_pending_for_source,
    ensure_interaction_message,
)
from .features import feature_hook
from .receipts import OperationResult
from .session_turns import TurnContext
from .session_views import session_view

if TYPE_CHECKING:
    from .operations import OperationTable
    from .services import HostServices

log = logging.getLogger(__name__)

SUBMIT_POLL_S = 0.025
# What a session may say about a model turn that failed (one line; the run's error).
MAX_TURN_ERROR = 2000
SUBMIT_WAIT_S = 300.0
# A worker that asked for an agent step writes the run's `waiting` next and exits.
WORKER_LET_GO_S = 5.0
DEADLINE_EXPIRED = "Workflow node model-turn deadline expired"
STALE_VALIDATION_ERROR = (
    "The validation worker stopped before it decided about this output; submit it again."
)


@dataclass
class Coordinator:
    connection_id: str
    epoch: str
    branch_reported: bool = False
    model_turn_active: bool = False
    # Its first branch report restarts the step clocks the previous coordinator stopped.
    needs_clock_restart: bool = True


@dataclass
class Watch:
    connection: Any
    subscription_id: str
    session_id: str
    last_digest: str | None = None
    revision: int = 0


def _require_text(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not valid_id(value):
        raise InvalidInputError(f"{key} must be text")
    return value


class Sessions:
    def __init__(self, services: HostServices) -> None:
        self.services = services
        self.coordinators: dict[str, Coordinator] = {}
        self.watches: dict[tuple[str, str], Watch] = {}
        self._tracked_connections: set[str] = set()
        self._publish_scheduled = False
        # Submissions a validation worker was launched for: if the worker is gone and
        # the submission still validates, nobody will decide it any more.
        self._validations_launched: set[str] = set()

    @feature_hook
    def piwh_register_operations(self, operations: OperationTable) -> None:
        operations.register_live("view.session.watch", self.watch)
        operations.register_live("view.unwatch", self.unwatch)
        operations.register_live("workflowMessage.reportBranch", self.report_branch)
        operations.register_live("workflowTurn.report", self.report_turn)
        operations.register_live("interaction.submit", self.submit)
        operations.register_durable("interaction.update", self.update)
        operations.wrap_durable("run.resume", self.resume)

    @feature_hook
    def piwh_worker_operation(
        self, operation: WorkerOperation, run_id: str, payload: dict[str, Any], result: Any
    ) -> None:
        if operation == WorkerOperation.REQUEST_INTERACTION:
            self._on_interaction_request(result)
        elif operation == WorkerOperation.REJECT_INTERACTION:
            self._on_interaction_rejected(run_id)
        elif operation in (
            WorkerOperation.ACCEPT_INTERACTION,
            WorkerOperation.REQUEST_NOTIFICATION,
        ):
            self.services.store.after_commit(self.publish_soon)

    @feature_hook
    def piwh_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        self.publish_soon()

    @feature_hook
    def piwh_startup(self) -> None:
        self.recover_inactive_model_turns()

    @feature_hook
    def piwh_session_has_coordinator(self, session_id: str) -> bool:
        return session_id in self.coordinators

    def recover_inactive_model_turns(self) -> None:
        """Startup: turns left open across a host outage do not pay for the downtime."""
        with self.services.store.transaction():
            step_deadlines.give_back_host_downtime(self.services.previous_heartbeat_at, now_ms())

    # --- coordinators and views -----------------------------------------------------------

    def _track(self, connection: Any) -> None:
        if connection.connection_id in self._tracked_connections:
            return
        self._tracked_connections.add(connection.connection_id)
        connection.on_close(lambda: self._detach(connection.connection_id))

    def _detach(self, connection_id: str) -> None:
        self._tracked_connections.discard(connection_id)
        for key in [key for key in self.watches if key[0] == connection_id]:
            del self.watches[key]
        for session_id, coordinator in list(self.coordinators.items()):
            if coordinator.connection_id == connection_id:
                del self.coordinators[session_id]
                self._stop_clocks(session_id)
        self.publish_soon()

    def _stop_clocks(self, session_id: str) -> None:
        """No coordinator works on the session's steps now: their deadlines stop counting."""
        if self.services.is_stopping:
            return  # the next host's startup stops them (and gives back its downtime)
        try:
            with self.services.store.transaction():
                step_deadlines.stop_session_clocks(session_id)
        except PiWorkflowsError as error:
            log.warning("could not stop the step clocks of a session: %s", error)

    def _coordinator_view(self, watch: Watch) -> dict[str, Any] | None:
        coordinator = self.coordinators.get(watch.session_id)
        if coordinator is None:
            return None
        return {
            "epoch": coordinator.epoch,
            "active": coordinator.connection_id == watch.connection.connection_id,
            "branchReported": coordinator.branch_reported,
        }

    def require_coordinator(self, connection: Any, session_id: str, epoch: Any) -> Coordinator:
        coordinator = self.coordinators.get(session_id)
        if (
            connection is None
            or coordinator is None
            or coordinator.connection_id != connection.connection_id
            or coordinator.epoch != epoch
        ):
            raise TurnConflictError("Workflow session coordinator was replaced")
        return coordinator

    async def watch(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        if connection is None:
            raise InvalidInputError("view.session.watch requires a live client connection")
        payload = request.payload
        subscription_id = _require_text(payload, "subscriptionId")
        session_id = _require_text(payload, "sessionId")
        as_coordinator = payload.get("coordinator", False)
        if not isinstance(as_coordinator, bool):
            raise InvalidInputError("view.session.watch coordinator must be a boolean")
        self._track(connection)
        self.watches[(connection.connection_id, subscription_id)] = Watch(
            connection, subscription_id, session_id
        )
        receipt: dict[str, Any] = {"subscribed": True}
        if as_coordinator:
            epoch = f"session-epoch-{secrets.token_hex(16)}"
            previous = self.coordinators.get(session_id)
            if previous is not None and previous.connection_id != connection.connection_id:
                self._stop_clocks(session_id)
            self.coordinators[session_id] = Coordinator(connection.connection_id, epoch)
            receipt["coordinatorEpoch"] = epoch
        self.publish_soon()
        return response(request.request_id, "accepted", receipt=receipt)

    async def unwatch(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        subscription_id = _require_text(request.payload, "subscriptionId")
        if connection is not None:
            self.watches.pop((connection.connection_id, subscription_id), None)
        return response(request.request_id, "accepted", receipt={"subscribed": False})

    def publish_soon(self) -> None:
        """Push changed session views once the current step of the event loop is done."""
        if self._publish_scheduled or not self.watches:
            return
        self._publish_scheduled = True
        asyncio.get_running_loop().call_soon(self.publish)

    def publish(self) -> None:
        self._publish_scheduled = False
        for watch in list(self.watches.values()):
            if not watch.connection.is_open:
                continue
            with self.services.store.transaction():
                view = session_view(watch.session_id, self._coordinator_view(watch))
            fingerprint = digest(view)
            if fingerprint == watch.last_digest:
                continue
            watch.last_digest = fingerprint
            watch.revision += 1
            watch.connection.push(
                {
                    "schema": SCHEMA,
                    "type": "event",
                    "subscriptionId": watch.subscription_id,
                    "event": "session_snapshot",
                    "revision": watch.revision,
                    "payload": view,
                },
                replaces=watch.subscription_id,
            )

    # --- branch and turn reports ----------------------------------------------------------

    async def report_branch(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        payload = request.payload
        session_id = _require_text(payload, "targetSessionId")
        epoch = payload.get("coordinatorEpoch")
        coordinator = self.require_coordinator(connection, session_id, epoch)
        entries = payload.get("entries")
        if not isinstance(entries, list):
            raise InvalidInputError("Workflow branch entries must be an array")
        pairs: list[tuple[str, str]] = []
        for entry in entries:
            if not isinstance(entry, dict):
                raise InvalidInputError("Workflow branch entries must be objects")
            pairs.append(
                (_require_text(entry, "workflowMessageId"), _require_text(entry, "sessionEntryId"))
            )
        if len({message_id for message_id, _ in pairs}) != len(pairs):
            raise InvalidInputError("Workflow branch report has duplicate messages")
        is_idle, has_pending = payload.get("isIdle"), payload.get("hasPendingMessages")
        if not isinstance(is_idle, bool) or not isinstance(has_pending, bool):
            raise InvalidInputError("isIdle and hasPendingMessages must be booleans")
        ctx = TurnContext()
        with _no_raw_integrity_errors():
            with self.services.store.transaction():
                if coordinator.needs_clock_restart:
                    step_deadlines.restart_session_clocks(session_id, now_ms())
                adopt_branch(session_id, pairs)
                if is_idle and not has_pending:
                    self._reconcile_idle(session_id, coordinator.epoch, {m for m, _ in pairs}, ctx)
        coordinator.branch_reported = True
        coordinator.needs_clock_restart = False
        coordinator.model_turn_active = not is_idle
        self._after_report(ctx)
        return response(
            request.request_id,
            "accepted",
            receipt={"recorded": True, "coordinatorEpoch": epoch},
        )

    def _reconcile_idle(
        self, session_id: str, epoch: str, branch_ids: set[str], ctx: TurnContext
    ) -> None:
        """An idle session with nothing pending proves its open turns are gone (SPEC §9.3)."""
        for turn in open_turns_for_session(session_id):
            # Lost ends are turn reports like any other: the adjudicating plugin decides.
            lost = TurnReport(
                state="ended",
                workflow_turn_id=turn.workflow_turn_id,
                workflow_message_id=turn.workflow_message_id,
                run_id=turn.run_id,
                target_session_id=session_id,
                coordinator_epoch=epoch,
                stop_reason="lost",
            )
            plugins.adjudicate_turn_report(lost, ctx)
            ctx.settled_runs.add(turn.run_id)
        for request in pending_step_requests(session_id):
            messages = messages_for_source(request.request_id)
            was_sent = any(m.status == "sent" for m in messages)
            if was_sent and not any(m.workflow_message_id in branch_ids for m in messages):
                self._present_again(request)

    def _present_again(self, request: InteractiveRequest) -> None:
        """A new `resumed` step message replaces whatever is pending for the request."""
        cancel_pending_for_source(request.request_id)
        bump_request_revision(request.request_id)
        ensure_interaction_message(get_request(request.request_id), "resumed")

    async def report_turn(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        report = _parse_turn_report(request.payload)
        coordinator = self.require_coordinator(
            connection, report.target_session_id, report.coordinator_epoch
        )
        if not coordinator.branch_reported:
            raise TurnConflictError("Workflow branch must be reported before model turns")
        try:
            ctx, receipt = self._adjudicate(report)
        except RunStillOwnedError:
            # The step's message goes out with the worker's interaction request, and the
            # run's claim is released by the worker's next write, a moment later: a turn
            # that ends in between (a model that failed at once) found the run still
            # owned and could not fail or pause it. Asked again once this host's worker
            # has let the run go.
            if not await self._worker_let_go(report.run_id):
                raise
            ctx, receipt = self._adjudicate(report)
        coordinator.model_turn_active = receipt.ownership == "active"
        if receipt.ownership == "settled":
            ctx.settled_runs.add(report.run_id)
        self._after_report(ctx)
        return response(request.request_id, receipt.outcome, receipt=receipt.to_json())

    def _adjudicate(self, report: TurnReport) -> tuple[TurnContext, TurnReceipt]:
        ctx = TurnContext()
        with _no_raw_integrity_errors():
            with self.services.store.transaction():
                return ctx, plugins.adjudicate_turn_report(report, ctx)

    async def _worker_let_go(self, run_id: str) -> bool:
        """Wait (up to WORKER_LET_GO_S) while this host runs a worker for the run; whether
        it ran one and it is done."""
        if not self.services.is_run_busy(run_id):
            return False
        deadline = time.monotonic() + WORKER_LET_GO_S
        while self.services.is_run_busy(run_id):
            if self.services.is_stopping or time.monotonic() > deadline:
                return False
            await asyncio.sleep(SUBMIT_POLL_S)
        return True

    def _after_report(self, ctx: TurnContext) -> None:
        for run_id, old_status, new_status in ctx.stopped_runs:
            self.services.run_stopped(run_id, old_status, new_status)
        for run_id in ctx.settled_runs:
            self.services.ensure_terminal_message(run_id)
        self.publish_soon()

    # --- interactions -------------------------------------------------------------------

    def _on_interaction_request(self, result: dict[str, Any]) -> None:
        request = get_request(result["requestId"])
        if request.status == "pending":
            ensure_interaction_message(request, "initial")
        self.services.store.after_commit(self.publish_soon)

    def _on_interaction_rejected(self, run_id: str) -> None:
        # The request stays pending: the run waits again, without a claim or a worker.
        if not self.services.release_to_waiting(run_id, EventType.RUN_INTERACTION_REJECTED):
            raise ConflictError("Rejected interaction could not release the run claim")
        self.services.store.after_commit(self.publish_soon)

    def _pending_request(self, request: ClientRequest) -> InteractiveRequest:
        payload = request.payload
        request_id = _require_text(payload, "requestId")
        interaction = find_request(request_id)
        if interaction is None or (request.run_id and request.run_id != interaction.run_id):
            raise NotFoundError(f"Interactive request not found: {request_id}")
        return interaction

    def _check_current(self, request: ClientRequest, interaction: InteractiveRequest) -> None:
        payload = request.payload
        if run_row(interaction.run_id).paused:
            raise ConflictError("Workflow run is paused")
        if (
            interaction.status != "pending"
            or payload.get("attempt") != interaction.attempt_id
            or payload.get("step") != interaction.node_id
        ):
            raise ConflictError("Interactive request attempt is stale")
        if request.expected_revision is None:
            raise InvalidInputError(
                f"{request.operation} requires expectedRevision (the request revision shown "
                "in the session view)"
            )
        if request.expected_revision != interaction.revision:
            raise ConflictError("Interactive request revision is stale")

    async def submit(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        key = _require_text(request.payload, "submissionId")
        if "value" not in request.payload:
            raise InvalidInputError("interaction.submit needs the step output as value")
        with self.services.store.transaction():
            interaction = self._pending_request(request)
            submission, created = self._begin_validation(request, interaction, key)
        if submission.outcome == "validating":
            self._launch_validation(interaction.run_id, submission.submission_id)
        deadline = time.monotonic() + SUBMIT_WAIT_S
        while submission.outcome == "validating":
            if self.services.is_stopping or time.monotonic() > deadline:
                return response(
                    request.request_id,
                    "unavailable",
                    error="The submission is still being validated; repeat it to see the result.",
                )
            await asyncio.sleep(SUBMIT_POLL_S)
            submission = get_submission(submission.submission_id)
        receipt = {
            "requestId": interaction.request_id,
            "submissionId": submission.idempotency_key,
            "runId": interaction.run_id,
            **read_json(submission.receipt_hash),
        }
        if submission.outcome == "rejected":
            return response(
                request.request_id,
                "rejected",
                receipt=receipt,
                error=receipt.get("error") or "Workflow step output failed validation",
            )
        return response(request.request_id, "accepted" if created else "adopted", receipt=receipt)

    def _begin_validation(
        self, request: ClientRequest, interaction: InteractiveRequest, key: str
    ) -> tuple[InteractiveSubmission, bool]:
        """Record a `validating` submission, or adopt the one with the same submissionId or
        sent under the same idempotency key (a retry that chose a new submissionId)."""
        payload_hash = put_json(request.payload["value"])
        # The row id is keyed by the envelope's idempotency key, per client.
        row_id = (
            "submission-"
            + digest([interaction.request_id, request.client_id, request.idempotency_key])[:40]
        )
        existing = submission_for(interaction.request_id, key, row_id)
        if existing is not None:
            if existing.payload_hash != payload_hash:
                raise ConflictError(
                    "This submission was already sent with another value; "
                    "use a new submissionId and idempotency key for a new value"
                )
            return existing, False
        self._check_current(request, interaction)
        if is_validating(interaction.request_id):
            raise ConflictError("Another submission of this step is still being validated")
        submission = record_validating_submission(
            row_id, interaction.request_id, key, interaction.revision, payload_hash, now_ms()
        )
        record_run_change(
            interaction.run_id,
            event_type=EventType.INTERACTION_SUBMITTED,
            actor=f"client:{request.client_id}",
            payload={"requestId": interaction.request_id, "submissionId": submission.submission_id},
        )
        return submission, True

    def _launch_validation(self, run_id: str, submission_id: str) -> None:
        """Claim the waiting run so a supervised worker runs the step's validator."""
        services = self.services
        if services.is_run_busy(run_id) or services.is_stopping:
            return  # the poll action tries again once the run's worker is gone
        if not services.admit(run_id):
            return  # no free slot, or a claim plugin refuses: the poll tries again
        with services.store.transaction():
            generation = services.claim_run(run_id, admitted=True, allow_pending_interaction=True)
        if generation is not None:
            self._validations_launched.add(submission_id)

    @feature_hook
    def piwh_poll(self) -> None:
        for submission in validating_submissions():
            run_id = submission.request.run_id
            if self.services.is_run_busy(run_id):
                continue
            if submission.submission_id in self._validations_launched:
                self._abandon_validation(submission)
            else:
                self._launch_validation(run_id, submission.submission_id)
        self._expire_timed_out_interaction()
        self.publish_soon()

    def _has_active_model_turn(self, session_id: str | None) -> bool:
        coordinator = self.coordinators.get(session_id) if session_id else None
        return (
            coordinator is not None
            and coordinator.branch_reported
            and (coordinator.model_turn_active)
        )

    def _expirable(self) -> list[InteractiveRequest]:
        return [
            request
            for request in step_deadlines.expired_requests(now_ms())
            if not self.services.is_run_busy(request.run_id)
            and self._has_active_model_turn(request.target_session_id)
        ]

    def _expire_timed_out_interaction(self) -> None:
        """Time out the first step whose deadline passed during a model turn (reference
        §6.9): cancel its request and claim the run, so a worker records the attempt
        `timed_out` and routes on from it."""
        services = self.services
        if services.is_stopping or not self._expirable():
            return  # an idle tick takes no write lock
        # The claim gate asks its plugins outside the transaction (`admit`).
        admitted = {r.run_id for r in self._expirable() if services.admit(r.run_id)}
        with services.store.transaction():
            for request in self._expirable():
                if request.run_id not in admitted or (
                    services.claim_run(
                        request.run_id, admitted=True, allow_pending_interaction=True
                    )
                    is None
                ):
                    continue
                self._begin_interaction_timeout(request)
                services.store.after_commit(self.publish_soon)
                return

    def _begin_interaction_timeout(self, request: InteractiveRequest) -> None:
        cancel_request(request.request_id, now_ms())
        cancel_pending_for_source(request.request_id, "step")
        reject_validating_submissions_of(request.request_id, DEADLINE_EXPIRED)
        record_run_change(
            request.run_id,
            event_type=EventType.RUN_INTERACTION_TIMEOUT_STARTED,
            actor="host",
            payload={"requestId": request.request_id, "attemptId": request.attempt_id},
            status_detail="finishing expired interaction deadline",
        )

    def _abandon_validation(self, submission: InteractiveSubmission) -> None:
        self._validations_launched.discard(submission.submission_id)
        with self.services.store.transaction():
            reject_validating_submission(submission.submission_id, STALE_VALIDATION_ERROR)

    def update(self, request: ClientRequest) -> OperationResult:
        """`interaction.update`: a progress update from the session working on a step."""
        interaction = self._pending_request(request)
        self._check_current(request, interaction)
        run_id = interaction.run_id
        lease = lease_row(run_id)
        if self.services.is_run_busy(run_id) or lease.is_live(now_ms()):
            return OperationResult(
                "claimLost", error="Interactive run is not available for update", run_id=run_id
            )
        value = request.payload.get("value")
        data = value.get("update") if isinstance(value, dict) else None
        if not isinstance(data, dict):
            raise InvalidInputError("interaction.update needs value.update as a JSON object")
        published = run_state.publish_update(
            run_id,
            {
                "type": "interaction.progress",
                "key": interaction.request_id,
                "data": data,
                "attemptId": interaction.attempt_id,
            },
        )
        return OperationResult(
            "accepted",
            receipt={"requestId": interaction.request_id, **published},
            revision=published["revision"],
            run_id=run_id,
        )

    def resume(self, request: ClientRequest, proceed: Any) -> OperationResult:
        """`run.resume` of a run paused at a step presents the step again (reference §6.4)."""
        run_id = request.run_id or request.payload.get("runId")
        if not valid_id(run_id):
            return proceed(request)
        run = find_run_row(run_id)
        interaction = (
            pending_step_request_of_run(run_id)
            if run is not None and run.paused and run.status == "waiting"
            else None
        )
        if interaction is None:
            return proceed(request)
        step_deadlines.give_back_pause(run_id, interaction, now_ms())
        revision = record_run_change(
            run_id,
            event_type=EventType.RUN_RESUMED,
            actor=f"client:{request.client_id}",
            payload={"status": "waiting"},
            paused=False,
            status_detail="waiting for the origin session",
        )
        self._present_again(interaction)
        self.services.store.after_commit(self.publish_soon)
        return OperationResult(
            "accepted",
            receipt={
                "runId": run_id,
                "status": "parked",
                "paused": False,
                "waitingForInteraction": True,
                "resumable": True,
                "alreadyRunning": False,
                "detail": "The pending origin-session interaction is resumed.",
            },
            revision=revision,
            run_id=run_id,
        )


class _no_raw_integrity_errors:
    """Turn a uniqueness violation that slipped past the pre-checks into a clear refusal."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> Literal[False]:
        raw = is_constraint_violation(error) or (
            isinstance(error, PluginError) and is_constraint_violation(error.__cause__)
        )
        if raw:
            raise TurnConflictError(
                "The report conflicts with the saved turns or messages of this session"
            ) from None
        return False


def _parse_turn_report(payload: dict[str, Any]) -> TurnReport:
    state = payload.get("state")
    if state not in ("started", "ended"):
        raise InvalidInputError("Workflow turn state must be started or ended")
    stop_reason = payload.get("stopReason")
    response_entry = payload.get("responseSessionEntryId")
    if state == "ended":
        if stop_reason not in STOP_REASONS:
            raise InvalidInputError("Workflow turn stopReason is invalid")
        if response_entry is not None and not valid_id(response_entry):
            raise InvalidInputError("Workflow turn responseSessionEntryId must be text or null")
    else:
        stop_reason, response_entry = None, None
    error = payload.get("error") if stop_reason == "error" else None
    if error is not None and not (isinstance(error, str) and 0 < len(error) <= MAX_TURN_ERROR):
        raise InvalidInputError(
            f"Workflow turn error must be text of 1 to {MAX_TURN_ERROR} characters"
        )
    return TurnReport(
        state=state,
        workflow_turn_id=_require_text(payload, "workflowTurnId"),
        workflow_message_id=_require_text(payload, "workflowMessageId"),
        run_id=_require_text(payload, "runId"),
        target_session_id=_require_text(payload, "targetSessionId"),
        coordinator_epoch=_require_text(payload, "coordinatorEpoch"),
        stop_reason=stop_reason,
        response_session_entry_id=response_entry,
        error=error,
    )
