"""The `forwarded_commands` rows: pause and cancel recorded for the host that owns a run
(SPEC §14). Write them inside ``StateStore.transaction()``; the owner's poll reads the
pending ones outside it.
"""

from __future__ import annotations

from ..clock import now_ms
from .models import ForwardedCommand as ForwardedCommand
from .models import Lease
from .prepared import PreparedQuery

# Asked at every poll of a host on a shared database, and almost always empty: the
# prepared check spares building the join.
_ANY_PENDING = PreparedQuery(
    lambda p: (
        ForwardedCommand.select(ForwardedCommand.command_id)
        .where(ForwardedCommand.status == "pending")
        .limit(1)
    )
)


def record_forwarded_command(run_id: str, operation: str, client_id: str) -> None:
    """A pending command for the run's owner to apply."""
    ForwardedCommand.create(
        run=run_id,
        operation=operation,
        client_id=client_id,
        status="pending",
        created_at=now_ms(),
    )


def pending_forwarded_commands() -> list[tuple[ForwardedCommand, Lease]]:
    """Every pending command with its run's claim row, oldest first."""
    if not _ANY_PENDING.exists():
        return []
    pending = (
        ForwardedCommand.select(ForwardedCommand, Lease)
        .join(Lease, on=(Lease.run == ForwardedCommand.run))
        .where(ForwardedCommand.status == "pending")
        .order_by(ForwardedCommand.command_id)
    )
    # The claim row rides on each command as the join above selected it.
    return [(command, command.lease) for command in pending]  # type: ignore[attr-defined]


def take_forwarded_command(command_id: int) -> bool:
    """Mark a pending command applied; False when another host applied it first."""
    taken: int = (
        ForwardedCommand.update(status="applied", applied_at=now_ms())
        .where((ForwardedCommand.command_id == command_id) & (ForwardedCommand.status == "pending"))
        .execute()
    )
    return taken == 1


def record_forwarded_outcome(command_id: int, outcome: str) -> None:
    """The outcome the applied command had."""
    ForwardedCommand.update(outcome=outcome).where(
        ForwardedCommand.command_id == command_id
    ).execute()
