"""A worker stops itself when its host has not renewed its run's lease in time.

The host sends a fence time after the launch and after each renewal of its lease
(`pi_workflows.host.worker_fence`). A watchdog thread waits for it; once it passes
without a newer one, the host may be stalled or cut off from its database and another
host may soon run this run's node. So before that can happen the watchdog kills the
process groups the node started, then the worker's own group (the worker with it, and
anything the node started without a group of its own). The host's writes are fenced by
the claim anyway; this fences what the node does outside the database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from datetime import UTC, datetime

from ..clock import now_ms
from .command import EXIT_CLAIM_LOST

# Waits are this short so that a wall clock stepped forward is noticed in time.
MAX_WAIT_S = 0.25


class LeaseFence:
    def __init__(self) -> None:
        self._fence_at: int | None = None  # armed by the host's first frame
        self._groups: set[int] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def extend(self, fence_at_ms: int) -> None:
        """A fence time from the host; the first one starts the watchdog."""
        with self._changed:
            self._fence_at = fence_at_ms
            self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="pi-workflows-lease-fence", daemon=True
                )
                self._thread.start()

    def add_group(self, process_group: int) -> None:
        """A process group the node starts (before it runs anything)."""
        with self._changed:
            self._groups.add(process_group)

    def discard_group(self, process_group: int) -> None:
        """The group's command ended and was reaped."""
        with self._changed:
            self._groups.discard(process_group)

    def _watch(self) -> None:
        with self._changed:
            while True:
                assert self._fence_at is not None
                left_s = (self._fence_at - now_ms()) / 1000
                if left_s <= 0:
                    break
                self._changed.wait(min(left_s, MAX_WAIT_S))
            groups, fence_at = sorted(self._groups), self._fence_at
        for group in groups:
            _kill_group(group)
        _say(
            "pi-workflows worker: stopping: the host has not renewed this run's lease since "
            f"its fence time {_iso(fence_at)}; another host may run the run now, so the node's "
            f"commands ({len(groups)} process group(s)) were killed.\n"
        )
        if os.getpgrp() == os.getpid():
            _kill_group(os.getpid())  # anything left in the worker's own group, and itself
        os._exit(EXIT_CLAIM_LOST)


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def _say(text: str) -> None:
    """Best effort on stderr: a stalled host reads no diagnostic, and a full pipe must
    not keep the worker from stopping."""
    with contextlib.suppress(OSError):
        os.set_blocking(2, False)
        os.write(2, text.encode("utf-8"))


def _iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")
