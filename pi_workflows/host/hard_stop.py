"""A host stop that ends the process within a bounded time, whatever state it is in.

A stop normally runs on the host's event loop (`Host.stop`), which waits at most
the `stop_wait_s` setting (10 s) for workers and tasks. That is not enough when the
loop itself is stuck (a plugin hook that never returns, a database call that hangs) or
when a stop step fails: the process would keep the home's lock, so every command says a
host runs while `host stop` cannot reach it. So a stop (and the first SIGTERM or SIGINT)
also arms a deadline on a thread of its own: if the host has not finished stopping by
then, that thread logs why, kills its workers' process groups, gives up the home's
lock and socket (this process's only) and exits; the runs' claims expire and the next
host resumes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .. import settings
from ..errors import DatabaseUnavailableError, HostLeaseLostError
from .lock import HostLock

log = logging.getLogger("pi_workflows.host")

HARD_STOP_EXIT_CODE = 70  # EX_SOFTWARE: the host stopped, but not cleanly
DEFAULT_STOP_WAIT_S = 10.0  # the `stop_wait_s` setting's default
# A stop the event loop cannot finish ends the process this much later.
HARD_STOP_MARGIN_S = 5.0


def stop_bound_s() -> float:
    """The longest a host takes from a stop request (or signal) to its exit."""
    return float(settings.value("stop_wait_s") or DEFAULT_STOP_WAIT_S) + HARD_STOP_MARGIN_S


@contextlib.contextmanager
def stop_step(what: str) -> Iterator[None]:
    """A stop step that must not keep the host from stopping: a lost lease, a database
    that is down or any other failure skips the step (logged), and the stop goes on."""
    try:
        yield
    except (HostLeaseLostError, DatabaseUnavailableError) as error:
        log.warning("stopping without %s: %s", what, error)
    except Exception:
        log.exception("stopping without %s", what)


class StopDeadline:
    """Armed by the first stop or signal; fires unless `finished()` comes first."""

    def __init__(
        self,
        lock: Callable[[], HostLock | None],
        worker_pids: Callable[[], list[int]],
        socket_path: os.PathLike[str],
        *,
        bound_s: float,
    ) -> None:
        self._lock = lock
        self._worker_pids = worker_pids
        self._socket_path = socket_path
        self._bound_s = bound_s
        self._done = threading.Event()
        self._armed = False

    def arm(self) -> None:
        if self._armed:
            return
        self._armed = True
        threading.Thread(target=self._watch, name="stop-deadline", daemon=True).start()

    def finished(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        if self._done.wait(self._bound_s):
            return
        log.error(
            "the host did not finish stopping within %.0f s (its event loop is blocked or a "
            "stop step hangs); exiting without the rest of the stop",
            self._bound_s,
        )
        for pid in self._worker_pids():  # each worker leads its own process group
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        lock = self._lock()
        if lock is not None:
            with contextlib.suppress(OSError):
                lock.release()
        with contextlib.suppress(OSError):
            os.unlink(self._socket_path)
        logging.shutdown()
        os._exit(HARD_STOP_EXIT_CODE)


def on_stop_signals(handler: Callable[[], None]) -> None:
    """Run `handler` on SIGINT/SIGTERM from the signal handler itself (the main thread
    between two bytecodes), not from the event loop: a blocked loop still hears them."""

    def received(signum: int, frame: Any) -> None:
        handler()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, received)
