"""Built-in claiming policy: oldest first, at most `max_workers` concurrent workers."""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..records import HostInfo, RunRecord


@hookimpl(trylast=True)
def piw_select_run_to_claim(candidates: list[RunRecord], host: HostInfo) -> RunRecord | None:
    if not candidates:
        return None
    return min(candidates, key=lambda run: (run.available_at, run.created_at, run.run_id))


@hookimpl
def piw_may_claim(run: RunRecord, host: HostInfo) -> bool:
    return host.active_workers < host.max_workers
