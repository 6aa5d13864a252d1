"""Built-in turn policy: the unproductive-turn limit of SPEC §9.4."""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..records import RunRecord

UNPRODUCTIVE_TURN_LIMIT = 3


@hookimpl(trylast=True)
def piw_unproductive_turn_limit(run: RunRecord, node_id: str) -> int:
    return UNPRODUCTIVE_TURN_LIMIT
