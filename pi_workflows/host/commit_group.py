"""Group commit: worker writes and client `run.start`s that arrive together share one
commit.

Each worker waits for its write's answer, and each client for its start's; each answer
waits for its commit (one fsync). Writes whose frames the event loop reads in the same
pass are applied in one transaction and answered after its one commit; a start joins
the group of the pass it was read in and commits it at once (it does not wait a loop
turn), so it shares the commit of the worker writes read with it. An entry refused with
an error of ours (`PiWorkflowsError`) undoes only itself; so does any failure of a
`contained` entry (a start: one failed request never fails the others). Any other
failure (the disk, the database) fails the whole group, as it would each write alone. A
lone write waits one loop pass, nothing more.

A group is first applied as one block: no savepoint between its entries, so what each
entry writes without reading travels with the group's next statement, and the blobs
they take up are checked once, at the commit (PostgreSQL: a group of worker writes is
two round trips, its statements and its ``COMMIT``, not two more per entry). When
anything in it fails, nothing of it is written and it is applied again, each entry in
a savepoint of its own, which refuses the failing one alone (a held write's or check's
failure may surface at a later entry's statement: only the savepoints tell whose it
was). An entry's `apply` therefore runs twice in that case, the first time rolled back.

The claim pass runs once, at the end of a group that made a run claimable or freed a
worker slot (`claim_at_end`), inside its transaction: the runs it claims commit with
the group, and one pass sees every slot the group frees, so the group never claims
more runs than the host has workers.

A client that sends `run.start` after `run.start`, each after the previous answer, goes
ahead of the workers: while it does, worker messages wait for their turn (`hold`), so a
start is served as soon as it is read instead of behind a pass of worker writes and
their commit. Anticipation, bounded both ways: a hold ends `HOLD_S` after the last
answered start, and never lasts longer than `MAX_HOLD_S`; then every waiting worker
message goes on before the next hold can begin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import DatabaseUnavailableError, HostLeaseLostError, PiWorkflowsError
from ..storage import StateStore

if TYPE_CHECKING:
    from .active_run import ActiveRun

ClaimPass = Callable[[list["ActiveRun"]], None]  # (the runs whose slots the group freed)

# How long worker messages wait for a streaming client's next start, and at most in all.
HOLD_S = 0.005
MAX_HOLD_S = 0.04


@dataclass
class _Entry:
    apply: Callable[[], Any]
    future: asyncio.Future[Any]
    contained: bool
    # What the entry asked of the claim pass: None marks a claimable run, else a freed slot.
    claims: list[ActiveRun | None] = field(default_factory=list)


class CommitGroup:
    def __init__(self, store: StateStore, claim_pass: ClaimPass) -> None:
        self.store = store
        self.claim_pass = claim_pass
        self._pending: list[_Entry] = []
        self._applying: _Entry | None = None
        self._workers_may_go = asyncio.Event()
        self._workers_may_go.set()
        self._held_since: float | None = None
        self._hold_ends: asyncio.TimerHandle | None = None

    def hold(self) -> None:
        """A streaming client's start was answered: its next one goes ahead of workers."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._held_since is None:
            self._held_since = now
        elif now - self._held_since >= MAX_HOLD_S:
            self.release()  # the workers' turn; a later start may hold again
            return
        self._workers_may_go.clear()
        if self._hold_ends is not None:
            self._hold_ends.cancel()
        self._hold_ends = loop.call_later(HOLD_S, self.release)

    def release(self) -> None:
        if self._hold_ends is not None:
            self._hold_ends.cancel()
            self._hold_ends = None
        self._held_since = None
        self._workers_may_go.set()

    async def worker_turn(self) -> None:
        """Returns at once, or when a hold ends (at most `MAX_HOLD_S` after it began)."""
        if not self._workers_may_go.is_set():
            await self._workers_may_go.wait()

    def submit(self, apply: Callable[[], Any], *, contained: bool = False) -> asyncio.Future[Any]:
        """`apply()` runs in the next group's transaction; the future holds what it
        returned once that transaction committed, or the error that refused it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append(_Entry(apply, future, contained))
        if len(self._pending) == 1:
            loop.call_soon(self.commit_now)
        return future

    def claim_at_end(self, freed: ActiveRun | None = None) -> None:
        """From an entry's `apply`: run the claim pass at the group's end, counting the
        slot of `freed` (a run this entry released) as free. Dropped if the entry fails."""
        assert self._applying is not None, "claim_at_end() belongs inside an entry's apply"
        self._applying.claims.append(freed)

    def commit_now(self) -> None:
        """Apply and commit the pending group (a start's does not wait for the loop)."""
        group, self._pending = self._pending, []
        if not group:
            return
        try:
            try:
                results, refusals = self._commit(group, in_blocks=False)
            except (HostLeaseLostError, DatabaseUnavailableError):
                raise  # the next try would find the same
            except Exception:
                if len(group) == 1:
                    raise  # alone, its failure is its own
                # Nothing was written; entry by entry, the failing one is refused alone.
                results, refusals = self._commit(group, in_blocks=True)
        except Exception as error:  # nothing of the group was written
            for entry in group:
                if not entry.future.done():
                    entry.future.set_exception(error)
            return
        for index, entry in enumerate(group):
            if entry.future.done():
                continue
            if index in refusals:
                entry.future.set_exception(refusals[index])
            else:
                entry.future.set_result(results[index])

    def _commit(
        self, group: list[_Entry], *, in_blocks: bool
    ) -> tuple[dict[int, Any], dict[int, Exception]]:
        """One transaction of `group`: what each entry returned, and the entries refused
        (only `in_blocks`, where each entry has a savepoint of its own; else any failure
        fails the transaction)."""
        refusals: dict[int, Exception] = {}
        results: dict[int, Any] = {}
        for entry in group:
            entry.claims.clear()  # asked again if the entry is applied again
        # The fence goes with the group's first statement (PostgreSQL): what an entry
        # does before it is kept in the host (a worker's goodbye noted, say), and a
        # host whose lease is lost stops.
        with self.store.transaction(fence_later=True):
            for index, entry in enumerate(group):
                if not in_blocks:
                    results[index] = self._apply(entry)
                    continue
                try:
                    results[index] = self._apply_in_block(entry)
                except HostLeaseLostError:
                    raise  # the whole transaction is refused, whichever entry heard it
                except Exception as failure:
                    if not (entry.contained or isinstance(failure, PiWorkflowsError)):
                        raise
                    refusals[index] = failure
            claims = [c for i, e in enumerate(group) if i in results for c in e.claims]
            if claims:
                self.claim_pass([freed for freed in claims if freed is not None])
        return results, refusals

    def _apply(self, entry: _Entry) -> Any:
        self._applying = entry
        try:
            return entry.apply()
        finally:
            self._applying = None

    def _apply_in_block(self, entry: _Entry) -> Any:
        try:
            with self.store.savepoint():
                return self._apply(entry)
        except BaseException:
            entry.claims.clear()
            raise
