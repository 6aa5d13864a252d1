"""Pause and cancel for runs another host owns (SPEC §14).

On a shared PostgreSQL database the host a client talks to may not run the workflow.
Status, list and why come straight from the database; pause and cancel are written as
durable `forwarded_commands` rows that the owning host applies on its next poll. A
durable row (rather than LISTEN/NOTIFY) survives the owner dying in between: once the
run has no live owner, any host applies it, and exactly once (compare-and-set on the
row's status in the transaction that applies it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..clock import now_ms
from ..errors import PiWorkflowsError
from ..protocol.client_messages import ClientRequest
from ..storage.forwarded_commands import (
    ForwardedCommand,
    pending_forwarded_commands,
    record_forwarded_command,
    record_forwarded_outcome,
    take_forwarded_command,
)
from ..storage.run_rows import find_lease_row
from .receipts import OperationResult

if TYPE_CHECKING:
    from ..storage import StateStore
    from .operations import OperationTable
    from .slots import WorkerSlots

log = logging.getLogger("pi_workflows.host.forwarded")


def owned_elsewhere(slots: WorkerSlots, run_id: str) -> bool:
    """True while another host holds the run's live claim."""
    if slots.is_busy(run_id):
        return False
    lease = find_lease_row(run_id)
    return lease is not None and lease.owner_id != slots.host_id and lease.is_live(now_ms())


def forward(request: ClientRequest, run_id: str) -> OperationResult:
    """Record the command for the run's owner (inside the command's transaction)."""
    record_forwarded_command(run_id, request.operation, request.client_id)
    return OperationResult(
        "accepted",
        receipt={
            "runId": run_id,
            "forwarded": True,
            "detail": "Another host runs this workflow; it applies the command within one poll.",
        },
        run_id=run_id,
    )


def apply_pending(slots: WorkerSlots, store: StateStore, table: OperationTable) -> None:
    """Poll: apply the commands for runs this host owns, or that no live host owns."""
    pending = pending_forwarded_commands()
    now = now_ms()
    for command, lease in pending:
        run_id = command.run_id
        mine = slots.is_busy(run_id)
        unowned = not lease.is_live(now)
        if mine or unowned:
            _apply(store, table, command)


def _apply(store: StateStore, table: OperationTable, command: ForwardedCommand) -> None:
    request = ClientRequest(
        request_id=f"forwarded-{command.command_id}",
        client_id=command.client_id,
        operation=command.operation,
        idempotency_key=f"forwarded-{command.command_id}",
        payload={},
        run_id=command.run_id,
        expected_revision=None,
        raw={},
    )
    try:
        with store.transaction():
            if not take_forwarded_command(command.command_id):
                return  # another host applied it
            result = table.durable_handler(command.operation)(request)
            record_forwarded_outcome(command.command_id, result.outcome)
    except PiWorkflowsError as error:
        log.warning("forwarded %s of a run failed: %s", command.operation, error)
