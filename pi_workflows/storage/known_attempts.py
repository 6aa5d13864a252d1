"""The node attempts of a run as of a revision this process committed, so a snapshot
write that finds the run still at that revision needs not read them again.

It holds because every change to a run's attempts (a snapshot, a park to `waiting`, a
cancellation) bumps the run's revision in the same transaction, and revisions only grow:
a run still at revision R has the attempts it had when R committed. A write that bumps
the run from R to R+1 therefore knows them when R is noted here.

`StateStore` keeps the transaction's notes apart until it commits (a rollback, or a
savepoint that rolls back, drops them): only committed attempts are ever answered.
"""

from __future__ import annotations

import threading

# attempt id -> (node id, attempt number, status, node type, started at)
Attempts = dict[str, tuple[str, int, str, str, int]]

# Runs whose attempts are remembered at most (a hint: forgetting costs one read).
KNOWN_RUNS = 4096


class _Noted(threading.local):
    """What this thread's open transaction wrote: run id -> (revision, attempts); None
    when no transaction is open (nothing is noted then)."""

    def __init__(self) -> None:
        self.runs: dict[str, tuple[int, Attempts]] | None = None


_noted = _Noted()
_committed: dict[str, tuple[int, Attempts]] = {}


def transaction_began() -> None:
    _noted.runs = {}


def rolled_back() -> None:
    if _noted.runs is not None:
        _noted.runs.clear()


def transaction_ended(committed: bool) -> None:
    runs, _noted.runs = _noted.runs, None
    if committed and runs:
        if len(_committed) + len(runs) > KNOWN_RUNS:
            _committed.clear()
        _committed.update(runs)


def known(run_id: str, revision: int) -> Attempts | None:
    """The run's attempts at `revision` (a copy), if this process wrote them; else None."""
    found = (_noted.runs or {}).get(run_id) or _committed.get(run_id)
    if found is None or found[0] != revision:
        return None
    return dict(found[1])


def note(run_id: str, revision: int, attempts: Attempts) -> None:
    """The run's attempts once the open transaction's write of `revision` is applied."""
    if _noted.runs is not None:
        _noted.runs[run_id] = (revision, attempts)
