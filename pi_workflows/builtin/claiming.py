"""Built-in claim selection: the highest priority first, then the oldest.

Capacity (`max_workers`, ``PI_WORKFLOWS_MAX_WORKERS``) is not a policy here: the host
stops a claim pass when it is full, so a veto plugin only ever refuses runs.

`run_claims.claim_candidates` returns candidates in this same order, so a host where no
other plugin selects takes its first candidate without building the window's records.
"""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..records import HostInfo, RunRecord


@hookimpl(trylast=True)
def piw_select_run_to_claim(candidates: list[RunRecord], host: HostInfo) -> RunRecord | None:
    if not candidates:
        return None
    return min(
        candidates, key=lambda run: (-run.priority, run.available_at, run.created_at, run.run_id)
    )
