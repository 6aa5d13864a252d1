"""Waiting in tests: poll a condition with a deadline, never sleep a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.01,
) -> Any:
    """Poll `predicate` until it returns a truthy value or the deadline passes.

    A predicate that costs real work (a database query over many rows) takes a longer
    `interval`, so the wait does not compete with what it waits for.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
