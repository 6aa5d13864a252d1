"""Hook calls with a deadline, so a plugin that hangs cannot freeze the host.

A hook implementation is plain synchronous code; the host cannot interrupt it. So the
host runs a job of hook calls on a daemon thread and waits for each call at most the
deadline (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``). A call past it marks its plugin *hung*: the
job is abandoned (its thread stops at its next call, if the plugin ever returns) and run
again without that plugin, and the plugin is left out of every later job until its stuck
call returns. One hung plugin costs the host one deadline, not its loop.

A call may be one implementation, or a whole pluggy hook call (so wrappers still wrap):
the plugin that is late is then the one whose code the job's thread is in. What a job
must do on the waiting thread (a hook called inside a transaction reads and writes
through that thread's connection) it hands over with :meth:`HookCalls.on_waiting_thread`;
the time that takes is not the plugin's.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from .errors import PluginError

# Named in the sentence of a missed deadline (the host's `hook_timeout_ms` setting).
HOOK_TIMEOUT_ENV = "PI_WORKFLOWS_HOOK_TIMEOUT_MS"

T = TypeVar("T")

log = logging.getLogger("pi_workflows.plugins")


class HookDeadlineError(PluginError):
    """A plugin did not answer a hook call within the hook deadline."""


class _Abandoned(BaseException):
    """Unwinds a job whose waiter gave up on it (a BaseException, so the job's own
    `except Exception` around each plugin call lets it through)."""


# Names the plugin whose code a stack frame (and its callers) is in.
Culprit = Callable[[FrameType | None], str]


class _Handover:
    """A function the job's thread asks the waiting thread to run, and its outcome."""

    def __init__(self, function: Callable[..., Any], args: Any, kwargs: Any) -> None:
        self.function, self.args, self.kwargs = function, args, kwargs
        self.outcome: dict[str, Any] = {}
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.outcome["result"] = self.function(*self.args, **self.kwargs)
        except BaseException as error:  # raised again on the job's thread
            self.outcome["error"] = error
        self.done.set()


class HookCalls:
    """What a job uses to call hook implementations; the deadline watches each call."""

    def __init__(self, runner: DeadlineRunner) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        self._abandoned = False
        # (plugin, hook, monotonic start) of the call in progress, None between calls;
        # the plugin is None for a whole hook call, found from the stack when it is late.
        self.current: tuple[str | None, str, float] | None = None
        self.culprit: Culprit | None = None
        self.thread_id = 0
        # The job's thread → the waiting thread: handovers, then None once the job ended.
        self.handovers: queue.SimpleQueue[_Handover | None] = queue.SimpleQueue()

    def is_usable(self, plugin: str) -> bool:
        """False while the plugin hangs in an earlier call: a job leaves it out."""
        return not self._runner.is_hung(plugin)

    def call(
        self,
        plugin: str | None,
        hook: str,
        function: Callable[..., Any],
        kwargs: Any,
        culprit: Culprit | None = None,
    ) -> Any:
        """`function(**kwargs)` under the deadline: one implementation of `plugin`, or (with
        `plugin` None) a whole hook call whose late plugin `culprit` names."""
        with self._lock:
            if self._abandoned:
                raise _Abandoned
            self.current = (plugin, hook, time.monotonic())
            self.culprit = culprit
        try:
            return function(**kwargs)
        finally:
            with self._lock:
                self.current = None
                hung = self._runner.hung_in(self) if self._abandoned else None
            if hung is not None:  # this call missed its deadline; the waiter went on
                self._runner.returned(hung)

    def on_waiting_thread(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function`, run on the thread that waits for the job when the job calls it."""

        def handed_over(*args: Any, **kwargs: Any) -> Any:
            if self._abandoned:
                raise _Abandoned  # nobody waits any more: the plugin's writes go nowhere
            handover = _Handover(function, args, kwargs)
            self.handovers.put(handover)
            handover.done.wait()
            if "error" in handover.outcome:
                raise handover.outcome["error"]
            return handover.outcome["result"]

        return handed_over

    def serve(self, handover: _Handover) -> None:
        """On the waiting thread: run a handover; its time is not the plugin's."""
        began = time.monotonic()
        if not self._abandoned:
            handover.run()
        else:
            handover.outcome["error"] = _Abandoned()
            handover.done.set()
        with self._lock:
            if self.current is not None:
                plugin, hook, start = self.current
                self.current = (plugin, hook, start + time.monotonic() - began)

    def give_up(
        self, late: tuple[str | None, str, float], timeout_s: float
    ) -> HookDeadlineError | None:
        """Abandon the job and mark the late plugin hung, if `late` is still the call in
        progress (else it just ended); the failure that names it. Marked under this lock,
        so the late call, when it returns, always finds the mark it clears."""
        frame = sys._current_frames().get(self.thread_id)
        with self._lock:
            if self.current != late:
                return None
            plugin, hook, _ = late
            if plugin is None:
                plugin = self.culprit(frame) if self.culprit is not None else "unknown plugin"
            failure = HookDeadlineError(
                f"Plugin {plugin!r} did not answer hook {hook} within "
                f"{timeout_s * 1000:.0f} ms ({HOOK_TIMEOUT_ENV}); the host goes on "
                "without it until that call returns"
            )
            failure.plugin_name = plugin
            self._abandoned = True
            self._runner.mark_hung(plugin, str(failure), self)
            return failure


def _work(job: Callable[[HookCalls], Any], calls: HookCalls, outcome: dict[str, Any]) -> None:
    """The job's thread: its result or its error into `outcome`, then the end mark."""
    calls.thread_id = threading.get_ident()
    try:
        outcome["result"] = job(calls)
    except _Abandoned:
        return  # nobody waits for it any more
    except BaseException as error:  # handed to the waiting thread
        outcome["error"] = error
    calls.handovers.put(None)


class DeadlineRunner:
    """Runs jobs of hook calls with a per-call deadline; remembers hung plugins."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._hung: dict[str, str] = {}  # plugin -> the sentence that names its hang
        self._hung_by: dict[int, str] = {}  # id(HookCalls) of a late call -> its plugin

    def is_hung(self, plugin: str) -> bool:
        with self._lock:
            return plugin in self._hung

    def hung(self) -> dict[str, str]:
        """The plugins that hang now, each with the sentence that names its hang."""
        with self._lock:
            return dict(self._hung)

    def mark_hung(self, plugin: str, sentence: str, calls: HookCalls) -> None:
        with self._lock:
            self._hung[plugin] = sentence
            self._hung_by[id(calls)] = plugin

    def hung_in(self, calls: HookCalls) -> str | None:
        """The plugin marked hung in this job's late call."""
        with self._lock:
            return self._hung_by.get(id(calls))

    def returned(self, plugin: str) -> None:
        with self._lock:
            self._hung.pop(plugin, None)
            self._hung_by = {key: name for key, name in self._hung_by.items() if name != plugin}
        log.warning("plugin %r returned from its hung hook call; the host asks it again", plugin)

    def run(
        self, job: Callable[[HookCalls], T], *, again: bool = True
    ) -> tuple[T, list[HookDeadlineError]]:
        """`job(calls)` on a daemon thread; its result, and a failure for each plugin that
        missed its deadline (the job then ran again without it).

        The caller waits (its thread is blocked), at most one deadline per hung plugin,
        and runs the job's handovers meanwhile. An exception of the job itself is raised
        here; so is a missed deadline when the job must not run `again` (what the late
        plugin did is then the caller's to undo).
        """
        timeouts: list[HookDeadlineError] = []
        while True:
            calls = HookCalls(self)
            outcome: dict[str, Any] = {}
            threading.Thread(
                target=_work,
                args=(job, calls, outcome),
                name="pi-workflows-hook",
                daemon=True,
            ).start()
            failure = self._wait(calls)
            if failure is None:
                if "error" in outcome:
                    raise outcome["error"]
                return outcome["result"], timeouts
            if not again:
                raise failure
            timeouts.append(failure)

    def _wait(self, calls: HookCalls) -> HookDeadlineError | None:
        """Wait for the job, running its handovers; the failure of a call that missed its
        deadline (the job is then abandoned and its plugin marked hung), or None once the
        job is done."""
        while True:
            try:
                handover = calls.handovers.get(timeout=self._left(calls))
            except queue.Empty:
                current = calls.current
                if current is None or time.monotonic() - current[2] < self.timeout_s:
                    continue
                failure = calls.give_up(current, self.timeout_s)
                if failure is not None:
                    _refuse_left(calls)
                    return failure
                continue
            if handover is None:
                return None
            calls.serve(handover)

    def _left(self, calls: HookCalls) -> float:
        current = calls.current
        if current is None:
            return self.timeout_s
        return max(0.0, current[2] + self.timeout_s - time.monotonic())


def _refuse_left(calls: HookCalls) -> None:
    """Handovers an abandoned job sent before it knew: refused, so its thread goes on."""
    while True:
        try:
            handover = calls.handovers.get_nowait()
        except queue.Empty:
            return
        if handover is not None:
            handover.outcome["error"] = _Abandoned()
            handover.done.set()
