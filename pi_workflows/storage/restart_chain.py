"""A run's restart chain (SPEC §10): the child a restart made of it, and the terminal
outcomes the chain has seen.
"""

from __future__ import annotations

from .models import Run


def restart_child(run_id: str) -> Run | None:
    """The run a restart made of this run, if any."""
    return Run.get_or_none((Run.parent_run_id == run_id) & (Run.lineage_kind == "restart"))


def outcome_seen_in_chain(root_run_id: str, terminal_fingerprint: str) -> bool:
    """True when a run of the chain was restarted from a terminal outcome with this
    fingerprint."""
    repeated = Run.select().where(
        (Run.root_run_id == root_run_id) & (Run.parent_terminal_fingerprint == terminal_fingerprint)
    )
    return bool(repeated.exists())
