"""Waiting in tests: poll a condition with a deadline, never sleep a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil

# The first pause between two polls, and the longest by default.
FIRST_PAUSE_S = 0.005
MAX_PAUSE_S = 0.05


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = MAX_PAUSE_S,
) -> Any:
    """Poll `predicate` until it returns a truthy value or the deadline passes.

    The pauses between polls start at 5 ms and grow by half each time up to `interval`:
    a condition that holds soon is seen soon, and a long wait costs few polls (each poll
    is work for the host it asks too, on the same cores). A predicate that costs real
    work (a database query over many rows) takes a longer `interval`.
    """
    deadline = time.monotonic() + timeout
    pause = min(FIRST_PAUSE_S, interval)
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(min(pause, max(deadline - now, 0.0)))
        pause = min(pause * 1.5, interval)


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
