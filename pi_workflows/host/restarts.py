"""`run.restart`: a fresh run of a finished run's workflow and input (SPEC §10).

Lineage rules: the child is `restart-<sha256(terminal message id)[:40]>` with lineage
`restart`, the parent's restart number + 1 and the parent's terminal fingerprint. A
chain allows at most three restarts, never restarts a cancelled run, and never restarts
into an outcome it has already seen; a repeat adopts the existing child.

Preconditions (reference 8.13 and A.6), simplified from its live-coordinator check: the
request carries `expectedRevision`, the finished run's exact revision (a run that moved on
is a `conflict`); the run must be interactive with an origin session; a `targetSessionId`
in the payload must be that session; no effect of the run may be unsettled (applying or in
doubt); the restart is about the run's latest terminal message, which must have been
shown in the session (`sent`; from a terminal, `pi-workflows session next SESSION` shows
it) and not cancelled (a `workflowMessageId` in the payload must name it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..canonical import sha256_hex
from ..errors import InvalidInputError
from ..protocol.client_messages import ClientRequest
from ..storage import effects, read_json
from ..storage.restart_chain import outcome_seen_in_chain, restart_child
from ..storage.run_rows import Run
from ..storage.run_statuses import is_terminal_status
from ..storage.runs import create_derived_run, get_run
from ..storage.terminal_facts import latest_terminal_message
from ..storage.workflow_messages import message_json
from .features import feature_hook
from .receipts import OperationResult

if TYPE_CHECKING:
    from .operations import OperationTable
    from .services import HostServices

RESTART_LIMIT = 3
CANCELLED_REFUSAL = "An explicitly cancelled workflow cannot be restarted"


def restart_run_id(workflow_message_id: str) -> str:
    return "restart-" + sha256_hex(workflow_message_id)[:40]


class Restarts:
    """The `run.restart` operation, as a host feature."""

    def __init__(self, services: HostServices) -> None:
        self.services = services

    @feature_hook
    def piwh_register_operations(self, operations: OperationTable) -> None:
        operations.register_durable("run.restart", self.run_restart)

    def run_restart(self, request: ClientRequest) -> OperationResult:
        result = restart_run(request)
        if result.outcome == "accepted":
            self.services.store.after_commit(self.services.schedule_claim_pass)
        return result


def restart_run(request: ClientRequest) -> OperationResult:
    """Reserve the restart child of a finished run (inside the request's transaction)."""
    run_id = request.target_run_id()
    run = get_run(run_id)
    payload = request.payload

    def refuse(error: str) -> OperationResult:
        return OperationResult("rejected", error=error, run_id=run_id)

    if run.execution_mode != "interactive" or run.origin_session_id is None:
        return refuse("Only an interactive workflow run with an origin session can be restarted")
    session = payload.get("targetSessionId")
    if session is not None and session != run.origin_session_id:
        return refuse("Workflow run belongs to another session")
    if run.status == "cancelled":
        return refuse(CANCELLED_REFUSAL)
    if not is_terminal_status(run.status):
        return refuse(f"Workflow run is {run.status}; only a finished run can be restarted")
    if request.expected_revision is None:
        raise InvalidInputError(
            "run.restart requires expectedRevision: the revision of the finished run you "
            f"restart ('pi-workflows run status {run_id}' shows it)."
        )
    if request.expected_revision != run.revision:
        return OperationResult(
            "conflict",
            error=f"Workflow run revision changed (it is {run.revision}, not "
            f"{request.expected_revision}); read it again and decide again.",
            run_id=run_id,
        )
    child = restart_child(run_id)
    if child is not None:
        return OperationResult("adopted", receipt=_receipt(child), run_id=child.run_id)
    if run.restart_number >= RESTART_LIMIT:
        return refuse(f"Workflow restart limit reached ({RESTART_LIMIT} restarts)")
    if effects.has_unsettled(run_id):
        return refuse(
            "Workflow run has unsettled effects; resolve them first "
            f"('pi-workflows effects list --run {run_id}')."
        )
    message = latest_terminal_message(run_id)
    if message is None:
        return refuse("Workflow run has no terminal result yet; retry once it is delivered")
    wanted = payload.get("workflowMessageId")
    if message.status == "cancelled" or (
        wanted is not None and wanted != message.workflow_message_id
    ):
        return refuse("Workflow terminal result is stale or was replaced")
    if message.status != "sent":
        return refuse(
            "Workflow terminal result is stale or was replaced: its session has not shown it "
            "yet ('pi-workflows session next SESSION' shows it)."
        )
    terminal = _terminal_details(message_json(message)["details"])
    if terminal is None:
        return refuse("Workflow terminal result carries no terminal fingerprint")
    if terminal.get("status") == "cancelled":
        return refuse(CANCELLED_REFUSAL)
    fingerprint = terminal["terminalFingerprint"]
    if outcome_seen_in_chain(run.root_run_id, fingerprint):
        return refuse("The same terminal outcome already occurred in this restart chain")
    child, _ = create_derived_run(
        run,
        run_id=restart_run_id(message.workflow_message_id),
        lineage_kind="restart",
        input=read_json(run.input_hash),
        actor=f"client:{request.client_id}",
        restart_number=run.restart_number + 1,
        parent_terminal_fingerprint=fingerprint,
    )
    return OperationResult(
        "accepted", receipt=_receipt(child), revision=child.revision, run_id=child.run_id
    )


def _terminal_details(details: Any) -> dict[str, Any] | None:
    """The facts saved with a terminal message, if they carry a fingerprint."""
    terminal = details.get("terminal") if isinstance(details, dict) else None
    fingerprint = terminal.get("terminalFingerprint") if isinstance(terminal, dict) else None
    return terminal if isinstance(fingerprint, str) else None


def _receipt(child: Run) -> dict[str, Any]:
    return {
        "runId": child.run_id,
        "parentRunId": child.parent_run_id,
        "restartNumber": child.restart_number,
    }
