"""Built-in turn policy: turn-report adjudication and the unproductive-turn limit (SPEC §9.4).

Only the receipt returned here grants a session ownership of a model turn. The rules
are those of pi-workflows 0.16.2: late and repeated reports are adopted with the saved
result, conflicting ones are refused, and nothing a session reports about a run that
already ended can give it a workflow turn.
"""

from __future__ import annotations

from typing import Any

from ..hookspecs import hookimpl
from ..records import RunRecord, TurnReceipt, TurnReport

UNPRODUCTIVE_TURN_LIMIT = 3

ABSENT = ("absent", None)


@hookimpl(trylast=True)
def piw_unproductive_turn_limit(run: RunRecord, node_id: str) -> int:
    return UNPRODUCTIVE_TURN_LIMIT


def _same_identity(turn: dict[str, Any], report: TurnReport) -> bool:
    return (turn["workflowMessageId"], turn["runId"], turn["targetSessionId"]) == (
        report.workflow_message_id,
        report.run_id,
        report.target_session_id,
    )


@hookimpl(trylast=True)
def piw_adjudicate_turn_report(report: TurnReport, ctx: Any) -> TurnReceipt:
    existing = ctx.get_turn(report.workflow_turn_id)
    if report.state == "ended":
        return _ended(report, ctx, existing)
    if existing is not None:
        # A repeated start: the saved turn decides, whatever happened since.
        turn = ctx.start_turn(report)
        return TurnReceipt("adopted", "active" if turn["state"] == "started" else "settled", turn)
    if (
        ctx.run_is_paused(report.run_id)
        or ctx.open_message_id(report.target_session_id) != report.workflow_message_id
    ):
        return TurnReceipt("adopted", *ABSENT)
    message = ctx.message(report.workflow_message_id)
    if message["kind"] == "step":
        if ctx.run_is_terminal(report.run_id):
            return TurnReceipt("adopted", *ABSENT)
        ctx.begin_step_turn(message)
    return TurnReceipt("accepted", "active", ctx.start_turn(report))


def _ended(report: TurnReport, ctx: Any, existing: dict[str, Any] | None) -> TurnReceipt:
    if existing is None:
        return TurnReceipt("adopted", *ABSENT)  # an end report never creates a turn
    if (
        existing["state"] == "ended"
        and existing["stopReason"] == "lost"
        and _same_identity(existing, report)
        and ctx.run_is_terminal(report.run_id)
    ):
        # The host already settled this turn when the run ended: its `lost` wins.
        return TurnReceipt("adopted", "settled", existing)
    outcome = "adopted" if existing["state"] == "ended" else "accepted"
    return TurnReceipt(outcome, "settled", ctx.apply_turn_end(report))
