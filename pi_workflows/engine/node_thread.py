"""The thread node code runs on, kept for the run's next attempt.

Node code runs off the engine's thread, which meanwhile serves the attempt's backend
calls, its deadline and stop requests. Starting a thread per attempt costs a thread
creation and two extra switches between threads on every node, so an attempt that ended
normally hands its thread to the next one. A thread whose attempt timed out or was
stopped may still be inside node code: the engine keeps it only once its job returned.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class NodeThread:
    """A daemon thread running jobs one after another."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._returned = threading.Condition()
        self._submitted = 0
        self._finished = 0
        self._thread = threading.Thread(target=self._serve, name="piw-node", daemon=True)
        self._thread.start()

    def run(self, name: str, job: Callable[[], None]) -> None:
        """Queue `job` (it starts once the previous job returned)."""
        self._submitted += 1
        self._thread.name = name
        self._jobs.put(job)

    def wait_idle(self, timeout_s: float) -> bool:
        """True once every queued job returned; False if one is still running."""
        with self._returned:
            return self._returned.wait_for(lambda: self._finished == self._submitted, timeout_s)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            finally:
                with self._returned:
                    self._finished += 1
                    self._returned.notify_all()
