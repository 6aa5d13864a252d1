"""The adjudication context: what ``piw_adjudicate_turn_report`` may read and write.

`TurnContext` is the ``ctx`` the hook receives; every read and write runs inside the
report's open transaction. It offers mechanisms only (record a turn, count an
unproductive end, remind, pause, fail); which consequence a turn end has is the
adjudicating plugin's policy (the built-in's is in ``pi_workflows.builtin.turns``), and an
idle branch report's lost ends go through the same hook.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import plugins
from ..clock import now_ms
from ..errors import RunStillOwnedError
from ..event_types import EventType
from ..records import TurnReport
from ..storage import interactions, record_run_change, run_claims, step_deadlines
from ..storage import turns as turn_store
from ..storage.run_rows import find_queue_row, find_run_row, lease_row, queue_row, run_row
from ..storage.runs import run_record
from ..storage.workflow_messages import (
    cancel_pending_for_source,
    ensure_interaction_message,
    get_workflow_message,
)
from .session_views import open_message_id

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
        queue = find_queue_row(run_id)
        return queue is None or queue.status in run_claims.TERMINAL_QUEUE_STATUSES

    def run_is_paused(self, run_id: str) -> bool:
        run = find_run_row(run_id)
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

    def end_turn(self, report: TurnReport) -> dict[str, Any]:
        """Record a turn's end (a repeat must match the saved one); no consequences."""
        turn, _ = turn_store.end_turn(report, self.now)
        return turn_store.turn_json(turn)

    # --- the step behind a turn: what turn-end policy may do to it -----------------------

    def pending_step(self, message_id: str) -> dict[str, Any] | None:
        """The pending agent step a step message presents, or None.

        ``{requestId, runId, nodeId, unproductiveTurnEnds, paused, validating}``;
        ``validating`` means a submission is being checked by the step's validator.
        """
        message = get_workflow_message(message_id)
        if message.kind != "step":
            return None
        request = interactions.find_request(message.source_id)
        if request is None or request.status != "pending":
            return None
        return {
            "requestId": request.request_id,
            "runId": request.run_id,
            "nodeId": request.node_id,
            "unproductiveTurnEnds": request.unproductive_turn_ends,
            "paused": self.run_is_paused(request.run_id),
            "validating": interactions.is_validating(request.request_id),
        }

    def unproductive_turn_limit(self, step: dict[str, Any]) -> int:
        """`piw_unproductive_turn_limit` for the step's run and node."""
        return plugins.unproductive_turn_limit(run_record(step["runId"]), step["nodeId"])

    def count_unproductive_end(self, request_id: str) -> int | None:
        """Count one more turn that ended without a valid submission; the new count, or
        None when the step is no longer pending."""
        return interactions.count_unproductive_end(request_id, self.now)

    def remind(self, request_id: str, preface: str) -> None:
        """Present the step again as a `reminder` message that starts with `preface`."""
        cancel_pending_for_source(request_id, "step")
        ensure_interaction_message(interactions.get_request(request_id), "reminder", preface)

    def pause_step(self, request_id: str) -> None:
        """Pause the step's parked run (the session interrupted it) and withdraw its prompts.

        RunStillOwnedError while a worker holds the run: the host adjudicates the report
        again once its own worker has let the run go."""
        run_id = interactions.get_request(request_id).run_id
        run = run_row(run_id)
        if not run.paused:
            lease = lease_row(run_id)
            queue = queue_row(run_id)
            is_owned = lease.is_live(self.now)
            if queue.status != "parked" or is_owned:
                raise RunStillOwnedError(
                    "Interrupted workflow turn could not pause its exact parked run"
                )
            record_run_change(
                run_id,
                event_type=EventType.RUN_PAUSED,
                actor="session",
                payload={"status": "parked", "reason": "aborted turn"},
                paused=True,
                status_detail=PAUSED_DETAIL,
            )
        cancel_pending_for_source(request_id, "step")

    def fail_step(self, request_id: str, error: str, code: str = "unproductiveTurns") -> None:
        """Cancel the step and fail its run with `code` and `error` (RunStillOwnedError
        while a worker holds the run, as `pause_step`)."""
        run_id = interactions.get_request(request_id).run_id
        cancel_pending_for_source(request_id, "step")
        interactions.cancel_request(request_id, self.now)
        old_status = run_row(run_id).status
        failed = run_claims.terminate_run(
            run_id,
            None,
            status="failed",
            code=code,
            error=error,
            status_detail=error,
        )
        if failed:
            self.stopped_runs.append((run_id, old_status, "failed"))
        elif not self.run_is_terminal(run_id):
            # Already terminal is fine (the worker or a cancel won the race); a live run is not.
            raise RunStillOwnedError(f"Workflow run could not fail: {error}")
        self.settled_runs.add(run_id)
