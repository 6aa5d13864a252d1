"""What a run's stored status says, for the layers that read one (SPEC §4)."""

from __future__ import annotations

from .models import TERMINAL_RUN_STATUSES as TERMINAL_RUN_STATUSES


def is_terminal_status(status: str) -> bool:
    """A status the run never leaves: completed, failed, timed out or cancelled."""
    return status in TERMINAL_RUN_STATUSES
