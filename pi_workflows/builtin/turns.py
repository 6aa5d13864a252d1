"""Built-in turn policy: turn-report adjudication and the unproductive-turn limit (SPEC §9.4).

Only the receipt returned here grants a session ownership of a model turn. The rules
are those of pi-workflows 0.16.2: late and repeated reports are adopted with the saved
result, conflicting ones are refused, and nothing a session reports about a run that
already ended can give it a workflow turn.
"""

from __future__ import annotations

from typing import Any

from ..hookspecs import hookimpl
from ..records import RunRecord, TurnContext, TurnReceipt, TurnReport

UNPRODUCTIVE_TURN_LIMIT = 3
TIMES = {1: "once", 2: "twice", 3: "three times"}

ABSENT = ("absent", None)


def reminder_preface(unproductive_ends: int) -> str:
    """What a reminder step message says before the step's prompt."""
    return (
        f"Reminder ({unproductive_ends} earlier turn(s) ended without a valid submission): "
        "submit the output of this workflow step.\n\n"
    )


def unproductive_failure(unproductive_ends: int) -> str:
    """The error of a run that failed for too many unproductive turns."""
    times = TIMES.get(unproductive_ends, f"{unproductive_ends} times")
    return f"Workflow step ended {times} without a valid submission"


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
def piw_adjudicate_turn_report(report: TurnReport, ctx: TurnContext) -> TurnReceipt:
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


def _ended(report: TurnReport, ctx: TurnContext, existing: dict[str, Any] | None) -> TurnReceipt:
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
    if existing["state"] == "ended":
        return TurnReceipt("adopted", "settled", ctx.end_turn(report))  # a matching repeat
    turn = ctx.end_turn(report)
    _step_turn_ended(report, ctx)
    return TurnReceipt("accepted", "settled", turn)


def _step_turn_ended(report: TurnReport, ctx: TurnContext) -> None:
    """The turn-end rule of SPEC §9.4: an interrupted step pauses its run; a turn the
    model failed (`error` with what failed) fails it; any other end without a valid
    submission earns a reminder, until the limit fails the run."""
    step = ctx.pending_step(report.workflow_message_id)
    if step is None:
        return
    if report.stop_reason == "aborted":
        ctx.pause_step(step["requestId"])
        return
    if step["paused"] or step["validating"]:
        return  # not the session's fault: the run is paused, or a submission is checked
    if report.stop_reason == "error" and report.error:
        # The provider or model failed (the session says which): reminders would only meet
        # the same failure, so the run fails now with that reason, as a headless step does.
        ctx.fail_step(step["requestId"], report.error, code="modelFailed")
        return
    ends = ctx.count_unproductive_end(step["requestId"])
    if ends is None:
        return
    if ends < ctx.unproductive_turn_limit(step):
        ctx.remind(step["requestId"], reminder_preface(ends))
    else:
        ctx.fail_step(step["requestId"], unproductive_failure(ends))
