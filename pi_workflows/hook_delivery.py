"""Notification hooks delivered off the committing thread, so an observer cannot stall it.

Each plugin that implements a notification hook gets a line: a bounded queue and a
long-lived daemon thread that calls the plugin's implementations one notification at a
time, in the order they were posted (so a plugin still hears a run's ``queued`` before
its ``claimed``, and an attempt's start before its end). Posting never blocks.

A call running longer than the hook deadline (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``) marks its
plugin *hung*, noticed at the next post: one log line names the plugin and the hook (no
arguments: they carry run data), what was queued behind the call is dropped, and so is
every notification posted until the call returns, when another line says so. A line whose
queue is full (a plugin slower than the notifications it gets) drops the newest until it
catches up, also said once. The other plugins' lines are not held up by either.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .hook_deadline import HOOK_TIMEOUT_ENV

# Notifications one plugin may have waiting; past it the newest are dropped.
QUEUE_CAPACITY = 10_000
# How long a process that exits waits for its lines to deliver what they hold.
EXIT_DRAIN_S = 5.0

log = logging.getLogger("pi_workflows.plugins")


@dataclass(frozen=True)
class Notification:
    hook: str
    function: Callable[..., Any]
    kwargs: dict[str, Any]


class _Line:
    """One plugin's queue and delivery thread."""

    def __init__(self, plugin: str, delivery: NotificationDelivery) -> None:
        self.plugin = plugin
        self._delivery = delivery
        self._lock = threading.Lock()
        # Two conditions over the one lock: the delivery thread waits for a post, the watch
        # and drains wait for a call to begin or end. Sharing one condition, a post's
        # notify() could wake the watch instead of an idle delivery thread, and the
        # notification stayed queued until the next post (the last one of a run, forever).
        self._posted = threading.Condition(self._lock)
        self._calls = threading.Condition(self._lock)
        self._queue: collections.deque[Notification] = collections.deque()
        # (hook, monotonic start) of the call in progress, None between calls.
        self._current: tuple[str, float] | None = None
        self._hung = False
        self._overflowing = False
        self._thread: threading.Thread | None = None

    def post(self, notification: Notification) -> None:
        with self._lock:
            if self._is_hung():
                return
            if len(self._queue) >= QUEUE_CAPACITY:
                if not self._overflowing:
                    self._overflowing = True
                    log.warning(
                        "plugin %r has %d notifications waiting; the newest are dropped "
                        "until it catches up",
                        self.plugin,
                        QUEUE_CAPACITY,
                    )
                return
            self._queue.append(notification)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._deliver, name=f"pi-workflows-notify-{self.plugin}", daemon=True
                )
                self._thread.start()
                threading.Thread(
                    target=self._watch, name=f"pi-workflows-watch-{self.plugin}", daemon=True
                ).start()
            self._posted.notify()

    def _is_hung(self) -> bool:
        """Under the lock: is the call in progress past the deadline? Marks it hung
        (and drops what waits behind it) the first time."""
        if self._hung:
            return True
        current = self._current
        if current is None or time.monotonic() - current[1] < self._delivery.timeout_s:
            return False
        self._hung = True
        dropped = len(self._queue)
        self._queue.clear()
        log.warning(
            "Plugin %r did not return from hook %s within %.0f ms (%s); its notifications "
            "are dropped until that call returns (%d waiting ones dropped now)",
            self.plugin,
            current[0],
            self._delivery.timeout_s * 1000,
            HOOK_TIMEOUT_ENV,
            dropped,
        )
        return True

    def _watch(self) -> None:
        """Marks the call in progress hung once its deadline passes, so a plugin that
        hangs on the last notification for a while is reported too, not only when the
        next one comes."""
        with self._lock:
            while True:
                current = self._current
                if current is None or self._hung:
                    self._calls.wait()
                    continue
                left = current[1] + self._delivery.timeout_s - time.monotonic()
                if left > 0:
                    self._calls.wait(left)
                else:
                    self._is_hung()

    def wait_idle(self, deadline: float) -> bool:
        """Wait until the line delivered what it holds or its call in progress is past
        the deadline (hung), at most until `deadline` (monotonic); True when it did."""
        with self._lock:
            while self._queue or self._current is not None:
                if self._is_hung():
                    return True
                now = time.monotonic()
                if now >= deadline:
                    return False
                left = deadline - now
                if self._current is not None:
                    left = min(left, self._current[1] + self._delivery.timeout_s - now)
                self._calls.wait(max(left, 0.001))
            return True

    def _deliver(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._posted.wait()
                notification = self._queue.popleft()
                self._current = (notification.hook, time.monotonic())
                self._calls.notify_all()  # the watch times this call
            try:
                notification.function(**notification.kwargs)
            except Exception as exc:
                log.warning(
                    "Plugin %r failed in hook %s: %s: %s",
                    self.plugin,
                    notification.hook,
                    type(exc).__name__,
                    exc,
                )
            with self._lock:
                started = self._current[1] if self._current else time.monotonic()
                self._current = None
                if self._hung:
                    self._hung = False
                    log.warning(
                        "plugin %r returned from hook %s after %.1f s; it gets notifications again",
                        self.plugin,
                        notification.hook,
                        time.monotonic() - started,
                    )
                if not self._queue:
                    self._overflowing = False
                self._calls.notify_all()  # the watch and drains wait for this


class NotificationDelivery:
    """The process's notification lines, one per plugin."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._lines: dict[str, _Line] = {}
        self._registered = False

    def post(self, plugin: str, notification: Notification) -> None:
        """Queue `notification` for `plugin`'s line; never blocks, never raises."""
        with self._lock:
            line = self._lines.get(plugin)
            if line is None:
                if not self._registered:  # a process that exits delivers what waits
                    self._registered = True
                    atexit.register(self.drain, EXIT_DRAIN_S)
                    os.register_at_fork(after_in_child=self.forget_lines)
                line = self._lines[plugin] = _Line(plugin, self)
        line.post(notification)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every line delivered what it holds (a hung one counts as done), at
        most `timeout_s`; True when all did."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            lines = list(self._lines.values())
        return all([line.wait_idle(deadline) for line in lines])

    def forget_lines(self) -> None:
        """In a forked child: the parent's delivery threads did not come along."""
        self._lines = {}
        self._lock = threading.Lock()
