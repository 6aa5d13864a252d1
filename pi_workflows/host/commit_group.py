"""Group commit for worker writes: writes that arrive together share one commit.

Each worker waits for its write's answer, and each answer waits for its commit (one
fsync). Writes whose frames the event loop reads in the same pass are applied in one
transaction and answered after its one commit. Each write runs in a savepoint of its
own: one refused with an error of ours (`PiWorkflowsError`) undoes only itself. Any
other failure (the disk, the database) fails the whole group, as it would each write
alone. A lone write waits one loop pass, nothing more.

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
from typing import Any

from ..errors import PiWorkflowsError
from ..storage import StateStore

# How long worker messages wait for a streaming client's next start, and at most in all.
HOLD_S = 0.005
MAX_HOLD_S = 0.04


class CommitGroup:
    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._pending: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
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

    def submit(self, apply: Callable[[], Any]) -> asyncio.Future[Any]:
        """`apply()` runs in the next group's transaction; the future holds what it
        returned once that transaction committed, or the error that refused it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((apply, future))
        if len(self._pending) == 1:
            loop.call_soon(self._commit)
        return future

    def _commit(self) -> None:
        group, self._pending = self._pending, []
        outcomes: list[tuple[asyncio.Future[Any], Any, PiWorkflowsError | None]] = []
        try:
            with self.store.transaction():
                if len(group) == 1:
                    # Alone: its refusal rolls the transaction back, no savepoint needed.
                    apply, future = group[0]
                    outcomes.append((future, apply(), None))
                else:
                    for apply, future in group:
                        try:
                            with self.store.savepoint():
                                outcomes.append((future, apply(), None))
                        except PiWorkflowsError as refusal:
                            outcomes.append((future, None, refusal))
        except Exception as error:  # nothing of the group was written
            for _, future in group:
                if not future.done():
                    future.set_exception(error)
            return
        for future, result, refusal in outcomes:
            if future.done():
                continue
            if refusal is not None:
                future.set_exception(refusal)
            else:
                future.set_result(result)
