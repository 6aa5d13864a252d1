"""Pre-started standby workers: the interpreter and imports are paid before a run needs them.

A cold worker spends most of its startup importing Python modules; a standby has done
that and waits for its launch envelope on stdin. Only launches of the built-in worker
command (`WorkerProcessSpec.standby_ok`, no extra environment) are served from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from ..builtin.launch import LAUNCH_ENV, worker_argv, worker_pythonpath
from ..protocol.framing import MAX_FRAME_BYTES
from ..records import WorkerProcessSpec

STANDBY_ENV = "PI_WORKFLOWS_STANDBY_WORKERS"
DEFAULT_STANDBY_WORKERS = 2

log = logging.getLogger(__name__)


def standby_size_setting() -> int:
    raw = os.environ.get(STANDBY_ENV)
    try:
        return max(0, int(raw)) if raw else DEFAULT_STANDBY_WORKERS
    except ValueError:
        return DEFAULT_STANDBY_WORKERS


def can_serve(spec: WorkerProcessSpec) -> bool:
    """True when a standby worker behaves exactly like a cold launch of `spec`."""
    return (
        spec.standby_ok
        and spec.argv == worker_argv(spec.argv[0] if spec.argv else None)
        and set(spec.env) <= {LAUNCH_ENV, "PYTHONPATH"}
        and spec.env.get("PYTHONPATH", worker_pythonpath()) == worker_pythonpath()
        and LAUNCH_ENV in spec.env
    )


class StandbyWorkers:
    def __init__(self, size: int, python: str, cwd: str) -> None:
        self.size = size
        self.python = python
        self.cwd = cwd
        self._ready: list[asyncio.subprocess.Process] = []
        self._spawning = 0
        self._closed = False

    def fill(self) -> None:
        """Start standbys in the background until `size` exist or are coming."""
        while not self._closed and len(self._ready) + self._spawning < self.size:
            self._spawning += 1
            asyncio.get_running_loop().create_task(self._spawn())

    async def _spawn(self) -> None:
        try:
            process = await asyncio.create_subprocess_exec(
                *worker_argv(self.python),
                "--standby",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.cwd,
                env={**os.environ, "PYTHONPATH": worker_pythonpath()},
                start_new_session=True,
                limit=MAX_FRAME_BYTES + 1,
            )
        except OSError:
            log.exception("could not start a standby worker")
            return
        finally:
            self._spawning -= 1
        if self._closed:
            _kill(process)
            return
        self._ready.append(process)

    def take(self, spec: WorkerProcessSpec) -> asyncio.subprocess.Process | None:
        """A live standby for `spec`, or None (then the caller spawns a cold worker)."""
        if not can_serve(spec):
            return None
        while self._ready:
            process = self._ready.pop(0)
            if process.returncode is None:
                self.fill()
                return process
        self.fill()
        return None

    async def close(self) -> None:
        self._closed = True
        processes, self._ready = self._ready, []
        for process in processes:
            _kill(process)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 2)


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
