"""What a terminal workflow message says about a finished run (SPEC §10).

The pure, database-side half of terminal messages: which runs need one, the facts
(`pi-workflows.terminal-result.v1`), the fingerprint and the message identity. Rendering
goes through plugins and is the host's business (`pi_workflows.host.terminal_messages`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..canonical import digest
from ..errors import IncompleteTerminalStateError
from ..records import EarlierOutcome, TerminalFacts
from .blobs import read_json, read_text
from .models import TERMINAL_RUN_STATUSES, Run, RunQueue, WorkflowMessage
from .prepared import PreparedQuery, tuple_rows
from .workflow_messages import workflow_message_id

TERMINAL_RESULT_SCHEMA = "pi-workflows.terminal-result.v1"
TERMINAL_QUEUE_STATUSES = ("done", "failed", "cancelled")
# The outcome a fingerprint identifies: the same outcome repeated across a restart chain
# has the same fingerprint (run id, name, restart number and ancestors are left out).
FINGERPRINT_FIELDS = ("workflowRef", "input", "status", "finalOutput", "error", "reason")
LOAD_FAILURE_DETAIL = "The supervised worker could not load the saved workflow source."


@dataclass(frozen=True)
class StateOverride:
    """Terminal values that replace the stored ones (a workflow load failure)."""

    status: str
    error: str | None
    status_detail: str | None


def terminal_source_id(run_id: str) -> str:
    return f"terminal:{run_id}"


def terminal_fingerprint(facts: TerminalFacts) -> str:
    fields: Mapping[str, object] = facts
    return digest({name: fields[name] for name in FINGERPRINT_FIELDS})


def terminal_message_id(run_id: str, fingerprint: str) -> str:
    return workflow_message_id("terminal", terminal_source_id(run_id), fingerprint)


_REQUIRED_FACTS = PreparedQuery(
    lambda p: (
        Run.select(Run.execution_mode, Run.origin_session_id, Run.status, RunQueue.status)
        .join(RunQueue, on=(RunQueue.run == Run.run_id))
        .where(Run.run_id == p.run_id)
    ),
    planned=True,
)


# Whether a run is interactive with an origin session, for the runs this process created
# or read (neither changes once the run exists): every run's stop asks, and most runs are
# headless. Cleared whole when full; a run not in it is read.
_INTERACTIVE_KNOWN_MAX = 4096
_interactive: dict[str, bool] = {}


def note_run_kind(run_id: str, execution_mode: str, origin_session_id: str | None) -> None:
    """What a run's creation or a read of its row says of it (`is_required`)."""
    if len(_interactive) >= _INTERACTIVE_KNOWN_MAX:
        _interactive.clear()
    _interactive[run_id] = execution_mode == "interactive" and origin_session_id is not None


def is_required(run_id: str, *, once_terminal: bool = False) -> bool:
    """An interactive run with an origin session whose queue and run are both terminal;
    with `once_terminal`, whatever its status (what never changes in a run: outside a
    transaction it tells which runs may skip one; known without a read for a run this
    process created or read, `note_run_kind`).

    The run status matters too: a checkpointed parent whose queue row is `done` because a
    continuation took over is still `waiting`; the continuation reports the outcome.
    """
    if once_terminal and run_id in _interactive:
        return _interactive[run_id]
    row = _REQUIRED_FACTS.first(run_id=run_id)
    if row is None:
        return False
    mode, origin, run_status, queue_status = row
    note_run_kind(run_id, mode, origin)
    return (
        mode == "interactive"
        and origin is not None
        and (
            once_terminal
            or (queue_status in TERMINAL_QUEUE_STATUSES and run_status in TERMINAL_RUN_STATUSES)
        )
    )


def latest_terminal_message(run_id: str) -> WorkflowMessage | None:
    latest: WorkflowMessage | None = (
        WorkflowMessage.select()
        .where(
            (WorkflowMessage.kind == "terminal")
            & (WorkflowMessage.source_id == terminal_source_id(run_id))
        )
        .order_by(WorkflowMessage.created_at.desc(), WorkflowMessage.order_number.desc())
        .first()
    )
    return latest


def runs_missing_terminal_messages() -> list[str]:
    """Every run, in every project, that needs a terminal message and has none."""
    has_message = WorkflowMessage.select(WorkflowMessage.run).where(
        WorkflowMessage.kind == "terminal"
    )
    query = (
        Run.select(Run.run_id)
        .join(RunQueue, on=(RunQueue.run == Run.run_id))
        .where(
            (Run.execution_mode == "interactive")
            & Run.origin_session_id.is_null(False)
            & RunQueue.status.in_(TERMINAL_QUEUE_STATUSES)
            & Run.status.in_(TERMINAL_RUN_STATUSES)
            & Run.run_id.not_in(has_message)
        )
        .order_by(Run.created_at)
    )
    return [run_id for (run_id,) in tuple_rows(query)]


def _outcome(run: Run) -> EarlierOutcome:
    return {
        "runId": run.run_id,
        "status": run.status,
        "reason": run.status_detail,
        "finalOutput": read_json(run.final_output_hash),
        "error": read_text(run.error_hash),
    }


def ancestor_outcomes(run_id: str) -> list[EarlierOutcome]:
    """Terminal ancestors along `parent_run_id`, oldest first (waiting ones are skipped)."""
    outcomes: list[EarlierOutcome] = []
    seen = {run_id}
    parent_id = Run.get_by_id(run_id).parent_run_id
    while parent_id is not None and parent_id not in seen:
        seen.add(parent_id)
        parent = Run.get_or_none(Run.run_id == parent_id)
        if parent is None:
            break
        if parent.status in TERMINAL_RUN_STATUSES:
            outcomes.append(_outcome(parent))
        parent_id = parent.parent_run_id
    outcomes.reverse()
    return outcomes


def terminal_facts(run_id: str, override: StateOverride | None = None) -> TerminalFacts | None:
    """The facts of a finished run, or None when it is not (yet) terminal.

    Raises IncompleteTerminalStateError when the run needs a message but is not terminal,
    and BlobConflictError when a stored value cannot be read as its kind.
    """
    run = Run.get_or_none(Run.run_id == run_id)
    if run is None or run.status not in TERMINAL_RUN_STATUSES:
        if is_required(run_id):
            raise IncompleteTerminalStateError(f"Terminal workflow state is incomplete: {run_id}")
        return None
    outcome = _outcome(run)
    if override is not None:
        outcome.update(
            {"status": override.status, "error": override.error, "reason": override.status_detail}
        )
    return {
        "schema": TERMINAL_RESULT_SCHEMA,
        "runId": run.run_id,
        "workflowName": run.workflow_name,
        "workflowRef": run.workflow_ref,
        "input": read_json(run.input_hash),
        "status": outcome["status"],
        "finalOutput": outcome["finalOutput"],
        "error": outcome["error"],
        "reason": outcome["reason"],
        "restartNumber": run.restart_number,
        "earlierOutcomes": ancestor_outcomes(run_id),
    }


def load_failure_override(run_id: str) -> StateOverride | None:
    """The override of a run that failed because its worker could not load the workflow."""
    queue = RunQueue.get_or_none(RunQueue.run == run_id)
    if queue is None or queue.error_code != "workflowLoadFailed":
        return None
    return StateOverride("failed", read_text(queue.error_hash), LOAD_FAILURE_DETAIL)
