"""Hook calls with a deadline, so a plugin that hangs cannot freeze the host.

A hook implementation is plain synchronous code; the host cannot interrupt it. So the
host runs a job of hook calls on a daemon thread and waits for each call at most the
deadline (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``). A call past it marks its plugin *hung*: the
job is abandoned (its thread stops at its next call, if the plugin ever returns) and run
again without that plugin, and the plugin is left out of every later job until its stuck
call returns. One hung plugin costs the host one deadline, not its loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import PluginError

# Named in the sentence of a missed deadline (the host's `hook_timeout_ms` setting).
HOOK_TIMEOUT_ENV = "PI_WORKFLOWS_HOOK_TIMEOUT_MS"

T = TypeVar("T")

log = logging.getLogger("pi_workflows.plugins")


class _Abandoned(BaseException):
    """Unwinds a job whose waiter gave up on it (a BaseException, so the job's own
    `except Exception` around each plugin call lets it through)."""


class HookCalls:
    """What a job uses to call one hook implementation; the deadline watches each call."""

    def __init__(self, runner: DeadlineRunner) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        self._abandoned = False
        # (plugin, hook, monotonic start) of the call in progress, None between calls.
        self.current: tuple[str, str, float] | None = None

    def is_usable(self, plugin: str) -> bool:
        """False while the plugin hangs in an earlier call: a job leaves it out."""
        return not self._runner.is_hung(plugin)

    def call(self, plugin: str, hook: str, function: Callable[..., Any], kwargs: Any) -> Any:
        with self._lock:
            if self._abandoned:
                raise _Abandoned
            self.current = (plugin, hook, time.monotonic())
        try:
            return function(**kwargs)
        finally:
            with self._lock:
                self.current = None
                late = self._abandoned
            if late:  # this call missed its deadline; the waiter went on without it
                self._runner.returned(plugin)

    def give_up(self, late: tuple[str, str, float], failure: PluginError) -> bool:
        """Abandon the job and mark the late plugin hung, if `late` is still the call in
        progress (else it just ended). Marked under this lock, so the late call, when it
        returns, always finds the mark it clears."""
        with self._lock:
            if self.current != late:
                return False
            self._abandoned = True
            self._runner.mark_hung(late[0], str(failure))
            return True


def _work(
    job: Callable[[HookCalls], Any],
    calls: HookCalls,
    outcome: dict[str, Any],
    done: threading.Event,
) -> None:
    """The job's thread: its result or its error into `outcome`, then `done`."""
    try:
        outcome["result"] = job(calls)
    except _Abandoned:
        return  # nobody waits for it any more
    except BaseException as error:  # handed to the waiting thread
        outcome["error"] = error
    done.set()


class DeadlineRunner:
    """Runs jobs of hook calls with a per-call deadline; remembers hung plugins."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._hung: dict[str, str] = {}  # plugin -> the sentence that names its hang

    def is_hung(self, plugin: str) -> bool:
        with self._lock:
            return plugin in self._hung

    def hung(self) -> dict[str, str]:
        """The plugins that hang now, each with the sentence that names its hang."""
        with self._lock:
            return dict(self._hung)

    def mark_hung(self, plugin: str, sentence: str) -> None:
        with self._lock:
            self._hung[plugin] = sentence

    def returned(self, plugin: str) -> None:
        with self._lock:
            self._hung.pop(plugin, None)
        log.warning("plugin %r returned from its hung hook call; the host asks it again", plugin)

    def run(self, job: Callable[[HookCalls], T]) -> tuple[T, list[PluginError]]:
        """`job(calls)` on a daemon thread; its result, and a failure for each plugin that
        missed its deadline (the job then ran again without it).

        The caller waits (its thread is blocked), at most one deadline per hung plugin.
        An exception of the job itself is raised here.
        """
        timeouts: list[PluginError] = []
        while True:
            calls = HookCalls(self)
            outcome: dict[str, Any] = {}
            done = threading.Event()
            threading.Thread(
                target=_work,
                args=(job, calls, outcome, done),
                name="pi-workflows-hook",
                daemon=True,
            ).start()
            failure = self._wait(calls, done)
            if failure is None:
                if "error" in outcome:
                    raise outcome["error"]
                return outcome["result"], timeouts
            timeouts.append(failure)

    def _wait(self, calls: HookCalls, done: threading.Event) -> PluginError | None:
        """Wait for the job; the failure of a call that missed its deadline (the job is
        then abandoned and its plugin marked hung), or None once the job is done."""
        while not done.wait(self._left(calls)):
            current = calls.current
            if current is None or time.monotonic() - current[2] < self.timeout_s:
                continue
            plugin, hook, _ = current
            failure = PluginError(
                f"Plugin {plugin!r} did not answer hook {hook} within "
                f"{self.timeout_s * 1000:.0f} ms ({HOOK_TIMEOUT_ENV}); the host goes on "
                "without it until that call returns"
            )
            failure.plugin_name = plugin
            if calls.give_up(current, failure):
                return failure
        return None

    def _left(self, calls: HookCalls) -> float:
        current = calls.current
        if current is None:
            return self.timeout_s
        return max(0.0, current[2] + self.timeout_s - time.monotonic())
