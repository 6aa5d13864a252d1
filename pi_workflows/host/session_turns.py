"""The adjudication context and the turn-end rule shared by turn and branch reports.

`TurnContext` is the ``ctx`` that ``piw_adjudicate_turn_report`` receives: every read
and write it offers runs inside the report's open transaction. Ending a step turn has
consequences for the run (reminder, pause, failure after too many unproductive turns);
they live here so an idle branch report ends lost turns by exactly the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import plugins
from ..clock import now_ms
from ..errors import TurnConflictError
from ..records import TurnReport
from ..storage import record_run_change, run_claims, step_deadlines
from ..storage import turns as turn_store
from ..storage.models import InteractiveRequest, Lease, Run, RunQueue
from ..storage.runs import run_record
from ..storage.workflow_messages import (
    cancel_pending_for_source,
    ensure_interaction_message,
    get_workflow_message,
)
from .session_views import is_validating, open_message_id

TIMES = {1: "once", 2: "twice", 3: "three times"}
PAUSED_DETAIL = "paused: the session interrupted the workflow step"


@dataclass
class TurnContext:
    """Store access for one turn or branch report, inside its transaction.

    After the commit the host reads `stopped_runs` (runs this report ended: their
    run-stopped effects follow) and `settled_runs` (runs that get a terminal-message
    check).
    """

    now: int = field(default_factory=now_ms)
    stopped_runs: list[tuple[str, str, str]] = field(default_factory=list)
    settled_runs: set[str] = field(default_factory=set)

    # --- reads -------------------------------------------------------------------------

    def get_turn(self, turn_id: str) -> dict[str, Any] | None:
        turn = turn_store.get_turn(turn_id)
        return turn_store.turn_json(turn) if turn is not None else None

    def message(self, message_id: str) -> dict[str, Any]:
        message = get_workflow_message(message_id)
        return {
            "workflowMessageId": message.workflow_message_id,
            "kind": message.kind,
            "sourceId": message.source_id,
            "runId": message.run_id,
            "targetSessionId": message.target_session_id,
            "status": message.status,
        }

    def run_is_terminal(self, run_id: str) -> bool:
        """True when the run is missing or its queue row is done, failed or cancelled."""
        queue = RunQueue.get_or_none(RunQueue.run == run_id)
        return queue is None or queue.status in run_claims.TERMINAL_QUEUE_STATUSES

    def run_is_paused(self, run_id: str) -> bool:
        run = Run.get_or_none(Run.run_id == run_id)
        return bool(run is not None and run.paused)

    def open_message_id(self, session_id: str) -> str | None:
        return open_message_id(session_id)

    # --- writes ------------------------------------------------------------------------

    def start_turn(self, report: TurnReport) -> dict[str, Any]:
        return turn_store.turn_json(turn_store.start_turn(report, self.now))

    def begin_step_turn(self, message: dict[str, Any]) -> None:
        """A step turn starts: the idle time since the step was last worked on moves its
        deadline, and superseded reminder/resumed prompts are no longer sent."""
        step_deadlines.begin_model_turn(message["sourceId"], self.now)
        cancel_pending_for_source(message["sourceId"], "step")

    def apply_turn_end(self, report: TurnReport) -> dict[str, Any]:
        """End a turn and apply what that means for its workflow step (SPEC §9.4)."""
        turn, ended_now = turn_store.end_turn(report, self.now)
        if ended_now:
            self._step_consequences(report)
        return turn_store.turn_json(turn)

    def _step_consequences(self, report: TurnReport) -> None:
        message = get_workflow_message(report.workflow_message_id)
        if message.kind != "step":
            return
        request = InteractiveRequest.get_or_none(InteractiveRequest.request_id == message.source_id)
        if request is None or request.status != "pending":
            return
        run_id = request.run_id
        if report.stop_reason == "aborted":
            self._pause_for_abort(run_id)
            cancel_pending_for_source(request.request_id, "step")
            return
        if self.run_is_paused(run_id) or is_validating(request.request_id):
            return
        changed = (
            InteractiveRequest.update(
                unproductive_turn_ends=InteractiveRequest.unproductive_turn_ends + 1,
                revision=InteractiveRequest.revision + 1,
                updated_at=self.now,
            )
            .where(
                (InteractiveRequest.request_id == request.request_id)
                & (InteractiveRequest.status == "pending")
            )
            .execute()
        )
        if changed != 1:
            return
        request = InteractiveRequest.get_by_id(request.request_id)
        limit = plugins.unproductive_turn_limit(run_record(run_id), request.node_id)
        if request.unproductive_turn_ends < limit:
            cancel_pending_for_source(request.request_id, "step")
            ensure_interaction_message(request, "reminder")
            return
        self._fail_unproductive(request)

    def _pause_for_abort(self, run_id: str) -> None:
        run = Run.get_by_id(run_id)
        if run.paused:
            return
        lease = Lease.get_by_id(run_id)
        queue = RunQueue.get_by_id(run_id)
        if queue.status != "parked" or (lease.owner_id is not None and lease.expires_at > self.now):
            raise TurnConflictError(
                "Interrupted workflow turn could not pause its exact parked run"
            )
        record_run_change(
            run_id,
            event_type="run.paused",
            actor="session",
            payload={"status": "parked", "reason": "aborted turn"},
            paused=True,
            status_detail=PAUSED_DETAIL,
        )

    def _fail_unproductive(self, request: InteractiveRequest) -> None:
        """Cancel the request and fail the run (`unproductiveTurns`)."""
        run_id = request.run_id
        cancel_pending_for_source(request.request_id, "step")
        InteractiveRequest.update(
            status="cancelled", revision=InteractiveRequest.revision + 1, updated_at=self.now
        ).where(InteractiveRequest.request_id == request.request_id).execute()
        old_status = Run.get_by_id(run_id).status
        times = TIMES.get(request.unproductive_turn_ends, f"{request.unproductive_turn_ends} times")
        error = f"Workflow step ended {times} without a valid submission"
        failed = run_claims.terminate_run(
            run_id,
            None,
            status="failed",
            code="unproductiveTurns",
            error=error,
            status_detail=error,
        )
        if failed:
            self.stopped_runs.append((run_id, old_status, "failed"))
        elif not self.run_is_terminal(run_id):
            # Already terminal is fine (the worker or a cancel won the race); a live run is not.
            raise TurnConflictError("Workflow run could not fail after three unproductive turns")
        self.settled_runs.add(run_id)
