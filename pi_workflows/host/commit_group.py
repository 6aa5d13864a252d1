"""Group commit for worker writes: writes that arrive together share one commit.

Each worker waits for its write's answer, and each answer waits for its commit (one
fsync). Writes whose frames the event loop reads in the same pass are applied in one
transaction and answered after its one commit. Each write runs in a savepoint of its
own: one refused with an error of ours (`PiWorkflowsError`) undoes only itself. Any
other failure (the disk, the database) fails the whole group, as it would each write
alone. A lone write waits one loop pass, nothing more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..errors import PiWorkflowsError
from ..storage import StateStore


class CommitGroup:
    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._pending: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []

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
