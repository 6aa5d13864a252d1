"""One supervised worker process: spawn, protocol pump, startup deadline, stop (SPEC §7.1)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.framing import MAX_WORKER_FRAME_BYTES, FrameError, decode_frame, encode_frame
from ..protocol.worker_messages import LEASE_MESSAGE_ID, LEASE_OUTCOME, worker_response
from ..records import WorkerProcessSpec
from ..worker import process_limits
from ..worker.command import is_worker_command
from .forkserver import ForkedWorker, ForkServer

STARTUP_TIMEOUT_S = 15.0
KILL_GRACE_S = 2.0
MAX_DIAGNOSTIC_BYTES = 64 * 1024

log = logging.getLogger(__name__)

MessageHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True)
class WorkerExit:
    outcome: str  # exited | cancelled | timedOut | crashed | claimLost | orphaned
    exit_code: int | None
    signal: int | None
    diagnostic: str | None


class WorkerSupervisor:
    """Runs a worker in its own process group and pumps its protocol frames.

    Frames from one worker are handled strictly in order; each response is written
    before the next frame is read, so the worker never races itself.
    """

    def __init__(
        self,
        spec: WorkerProcessSpec,
        handler: MessageHandler,
        *,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        fence_at: Callable[[], int] | None = None,
    ) -> None:
        self.spec = spec
        self.handler = handler
        self.startup_timeout_s = startup_timeout_s
        # The host's fence time for its workers (host/worker_fence.py); None for a worker
        # process that does not read `host.lease` frames (a plugin's own).
        self.fence_at = fence_at
        self.process: asyncio.subprocess.Process | ForkedWorker | None = None
        self.ready = asyncio.Event()
        self.saw_exiting = False
        self._requested_outcome: str | None = None
        self._diagnostic = bytearray()
        self._stopping: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(
        self,
        fork_server: ForkServer | None = None,
        *,
        first_frame: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        """Fork the worker from the fork server when it can serve the spec, else spawn it.

        `first_frame()`: a frame the worker reads before it asks anything (worker.ready's
        answer sent with the launch), or None; asked once, while the worker starts.
        """
        built: list[bytes] = []

        def frame() -> bytes:
            if not built:
                message = first_frame() if first_frame is not None else None
                limit = MAX_WORKER_FRAME_BYTES
                built.append(b"" if message is None else encode_frame(message, limit))
            return built[0]

        spec, limits = self.spec, process_limits.encoded(self.spec.nice, self.spec.rlimits)
        if limits is not None:
            spec = dataclasses.replace(spec, env={**spec.env, process_limits.LIMITS_ENV: limits})
        if fork_server is not None:
            self.process = await fork_server.launch(spec, frame)
            if self.process is not None:
                self.tell_lease()
                return
            if self._requested_outcome is not None:
                return  # stopped while the fork was pending: start nothing
        env = {**os.environ, **spec.env}
        self.process = await asyncio.create_subprocess_exec(
            *spec.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=spec.cwd,
            env=env,
            start_new_session=True,  # own process group: stop() signals the whole tree
            limit=MAX_WORKER_FRAME_BYTES + 1,
        )
        if limits is not None and not is_worker_command(spec.argv):
            # A command of the plugin's own does not read the variable: set them on it.
            process_limits.apply_to(self.process.pid, limits)
        if frame():
            assert self.process.stdin is not None  # stdin=PIPE above
            self.process.stdin.write(frame())
        self.tell_lease()

    def tell_lease(self) -> None:
        """Send the worker its fence time (after the launch and each lease renewal).

        Written ahead of any reply still to come, so the worker knows it before it
        runs any node code; it is not drained: the worker reads these frames on a
        thread of their own, whatever its engine does.
        """
        process = self.process
        if self.fence_at is None or process is None or process.stdin is None:
            return
        if process.returncode is not None:
            return
        assert process.stdin is not None  # stdin=PIPE (a forked worker's too)
        frame = worker_response(
            LEASE_MESSAGE_ID, LEASE_OUTCOME, result={"fenceAtMs": self.fence_at()}
        )
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            process.stdin.write(_frame_for_worker(frame))

    async def run(self) -> WorkerExit:
        """Pump frames until the worker exits; returns how it ended."""
        if self.process is None:  # stopped before a process existed
            return WorkerExit(self._requested_outcome or "crashed", None, None, None)
        stderr_task = asyncio.create_task(self._collect_stderr())
        deadline_task = asyncio.create_task(self._startup_deadline())
        try:
            await self._pump()
        finally:
            deadline_task.cancel()
        code = await self.process.wait()
        await stderr_task
        if self._stopping is not None:
            await self._stopping
        return self._exit(code)

    def _exit(self, code: int) -> WorkerExit:
        exit_code, signal_number = (None, -code) if code < 0 else (code, None)
        if self._requested_outcome is not None:
            outcome = self._requested_outcome
        elif code == 0 and self.saw_exiting:
            outcome = "exited"
        else:
            outcome = "crashed"
        diagnostic = self._diagnostic.decode("utf-8", "replace") or None
        return WorkerExit(outcome, exit_code, signal_number, diagnostic)

    async def _pump(self) -> None:
        assert self.process and self.process.stdout and self.process.stdin
        while True:
            try:
                line = await self.process.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                self.note("worker sent a protocol line over 64 MiB")
                self.stop("crashed")
                return
            if not line:
                return
            try:
                message = decode_frame(line, MAX_WORKER_FRAME_BYTES)
                reply = await self.handler(message)
            except FrameError as error:
                self.note(f"bad worker frame: {error}")
                self.stop("crashed")
                return
            except Exception as error:  # a host-side bug must not leave the worker hanging
                log.exception("worker message handling failed")
                self.note(f"host failed to handle a worker message: {error}")
                self.stop("crashed")
                return
            if reply is None:
                continue
            with contextlib.suppress(ConnectionError, BrokenPipeError):
                self.process.stdin.write(_frame_for_worker(reply))
                await self.process.stdin.drain()

    async def _collect_stderr(self) -> None:
        assert self.process and self.process.stderr
        while chunk := await self.process.stderr.read(4096):
            room = MAX_DIAGNOSTIC_BYTES - len(self._diagnostic)
            if room > 0:
                self._diagnostic.extend(chunk[:room])

    async def _startup_deadline(self) -> None:
        try:
            await asyncio.wait_for(self.ready.wait(), self.startup_timeout_s)
        except TimeoutError:
            self.note("Workflow worker startup timed out")
            self.stop("timedOut")

    def note(self, text: str) -> None:
        """Add a line to the worker's diagnostic (host-side reasons for stopping it)."""
        room = MAX_DIAGNOSTIC_BYTES - len(self._diagnostic)
        if room > 0:
            self._diagnostic.extend((text + "\n").encode()[:room])

    def stop(self, outcome: str) -> asyncio.Task | None:
        """SIGTERM the worker's process group, SIGKILL after the grace period."""
        if self._requested_outcome is None:
            self._requested_outcome = outcome
        if self.process is None or self.process.returncode is not None:
            return None
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._terminate())
        return self._stopping

    async def _terminate(self) -> None:
        assert self.process is not None
        pgid = self.process.pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), KILL_GRACE_S)
        except TimeoutError:
            _signal_group(pgid, signal.SIGKILL)
        # Children that ignored SIGTERM must not outlive their worker.
        _signal_group(pgid, signal.SIGKILL)


def _frame_for_worker(reply: dict[str, Any]) -> bytes:
    """The reply as one pipe line; a reply longer than a line (a run state over 64 MiB)
    becomes a bounded rejection, so the worker hears why instead of waiting forever."""
    try:
        return encode_frame(reply, MAX_WORKER_FRAME_BYTES)
    except FrameError as error:
        refusal = worker_response(
            str(reply.get("messageId")),
            "rejected",
            error=f"The host's answer could not be transferred: {error}",
        )
        return encode_frame(refusal, MAX_WORKER_FRAME_BYTES)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
