"""The host's side of the worker fork server (`pi_workflows.worker.zygote`).

Launches of the built-in worker command are forked from a process that has already
imported everything, so a worker is ready in milliseconds instead of after a cold
interpreter start. The forked worker is the leader of its own process group and speaks
the worker protocol on pipes the host created, exactly like a spawned one. `host run`
forks its fork server-to-be as it starts (`zygote.fork_standby`, before it imports the
host), which imports what workers need while the host starts, and the host's first
launch makes it serve. A host that has no standby (one running in a process with other
threads, or whose standby died) starts the fork server as a new interpreter at its first
launch. A launch that comes while the fork server is
still starting waits for it (at most `STARTING_WAIT_S`): a cold start beside it would
cost more than the wait, on every core. When the fork server is not available (it
died, could not start, or did not start in time) the host spawns a cold worker instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable

import psutil

from ..protocol.framing import MAX_WORKER_FRAME_BYTES
from ..records import WorkerProcessSpec
from ..worker import zygote
from ..worker.command import LAUNCH_ENV, is_worker_command, worker_argv, worker_pythonpath

FORK_REPLY_TIMEOUT_S = 10.0
STARTING_WAIT_S = 5.0
# While a launch waits for the fork server's reply, it looks this often whether the
# fork server was stopped (SIGSTOP): one that is cannot answer and is replaced at once.
STALL_CHECK_S = 0.1
# How long a closing host waits for its fork server to end its spare and exit (it takes
# milliseconds) before it kills it.
CLOSE_WAIT_S = 2.0

log = logging.getLogger(__name__)


def can_serve(spec: WorkerProcessSpec) -> bool:
    """True when a forked worker behaves exactly like a cold launch of `spec`: its extra
    variables are set before the worker runs, but those an interpreter reads when it
    starts (``PYTHON*``, ``LD_*``) would come too late."""
    return (
        spec.forkable
        and is_worker_command(spec.argv)
        and LAUNCH_ENV in spec.env
        and not any(name.startswith(STARTUP_PREFIXES) for name in _extra_env(spec))
        and spec.env.get("PYTHONPATH", worker_pythonpath()) == worker_pythonpath()
    )


# Variables read at interpreter start-up: a forked worker cannot honour them.
STARTUP_PREFIXES = ("PYTHON", "LD_")


def _extra_env(spec: WorkerProcessSpec) -> dict[str, str]:
    """The spec's variables beyond the launch envelope and the worker's PYTHONPATH."""
    return {k: v for k, v in spec.env.items() if k not in (LAUNCH_ENV, "PYTHONPATH")}


class ForkedWorker:
    """A worker forked by the zygote, with the interface of an asyncio subprocess."""

    def __init__(self, pid: int, stdin, stdout, stderr, exit_future: asyncio.Future) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._exit = exit_future

    @property
    def returncode(self) -> int | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> int:
        # Shielded: a caller that gives up waiting (wait_for) must not cancel the exit
        # every other waiter of this worker shares.
        return await asyncio.shield(self._exit)


def _waitpid(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


class ForkedChild:
    """A forked process, with the part of an asyncio subprocess's interface the fork
    server uses: its end is seen on a pidfd, and then `reap(pid)` collects its exit
    status (by default `waitpid`: it is this process's own child)."""

    def __init__(self, pid: int, reap: Callable[[int], int] = _waitpid) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)
        self._collect = reap
        self._reaping: asyncio.Task[int] | None = None

    async def wait(self) -> int:
        # One reaping task for all waiters, shielded from a waiter that gives up.
        if self._reaping is None:
            self._reaping = asyncio.get_running_loop().create_task(self._reap())
        return await asyncio.shield(self._reaping)

    async def _reap(self) -> int:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(self._pidfd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = self._collect(self.pid)
        return self.returncode


class Standby:
    """The fork server-to-be a starting host forked (`zygote.standby`): it waits, on
    `control`, for the host's first launch."""

    def __init__(self, process: ForkedChild, control: socket.socket) -> None:
        self.process = process
        self.control = control

    @classmethod
    def adopt(cls, forked: zygote.ForkedStandby) -> Standby:
        """The standby `zygote.fork_standby` forked from this process, watched by it."""
        return cls(ForkedChild(forked.pid), forked.control)


class ForkServer:
    def __init__(self, python: str, cwd: str, standby: Standby | None = None) -> None:
        self.python = python
        self.cwd = cwd
        self._standby = standby
        self._socket: socket.socket | None = None
        self._process: asyncio.subprocess.Process | ForkedChild | None = None
        self._ready = False
        self._closed = False
        self._launches: dict[str, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future] = {}
        # Exit codes of workers that died before launch() registered them (a worker can
        # exit within microseconds of its fork, e.g. a workflow that kills it at import).
        self._early_exits: dict[int, int] = {}
        self._reader: asyncio.Task | None = None
        # While the zygote starts: True once it is ready, False if it ends first.
        self._starting: asyncio.Future[bool] | None = None
        self._standby_watch = (
            None
            if standby is None
            else asyncio.get_running_loop().create_task(self._watch_standby(standby))
        )

    async def _watch_standby(self, standby: Standby) -> None:
        """Reap a standby that dies before the first launch (it is not replaced until then)."""
        code = await standby.process.wait()
        if self._standby is standby:
            self._standby = None
            standby.control.close()
            log.warning(
                "worker fork server (PID %d) exited with %s before the first launch",
                standby.process.pid,
                code,
            )

    async def start(self) -> None:
        """Start the zygote; launches are forked once it reports ready."""
        self._starting = asyncio.get_running_loop().create_future()
        try:
            self._process, host_end = self._woken_standby() or await self._new_interpreter()
        except BaseException:
            self._end_starting(False)  # nothing to wait for
            raise
        host_end.setblocking(False)
        self._socket = host_end
        self._reader = asyncio.get_running_loop().create_task(self._read_replies())

    def _woken_standby(self) -> tuple[ForkedChild, socket.socket] | None:
        """The standby, told to serve; None when there is none (any more)."""
        standby, self._standby = self._standby, None
        if standby is None:
            return None
        try:
            standby.control.send(zygote.SERVE)
        except OSError:
            # It died (`_watch_standby` reaps it): the fork server starts the other way.
            standby.control.close()
            return None
        return standby.process, standby.control

    async def _new_interpreter(self) -> tuple[asyncio.subprocess.Process, socket.socket]:
        host_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await asyncio.create_subprocess_exec(
                *worker_argv(self.python),
                "--zygote",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                cwd=self.cwd,
                env={
                    **os.environ,
                    "PYTHONPATH": worker_pythonpath(),
                    zygote.CONTROL_FD_ENV: str(zygote_end.fileno()),
                },
                pass_fds=(zygote_end.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            host_end.close()
            raise
        finally:
            zygote_end.close()
        return process, host_end

    async def _read_replies(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._socket is not None
        while True:
            try:
                data = await loop.sock_recv(self._socket, 65536)
            except OSError:
                data = b""
            if not data:
                break
            reply = json.loads(data)
            if reply.get("ready"):
                self._ready = True
                self._end_starting(True)
            elif "launchId" in reply:
                future = self._launches.pop(reply["launchId"], None)
                if future is not None and not future.done():
                    future.set_result(reply["pid"])
            elif "exited" in reply:
                future = self._exits.pop(reply["exited"], None)
                if future is None:
                    self._early_exits[reply["exited"]] = reply["code"]
                elif not future.done():
                    future.set_result(reply["code"])
        self._ready = False
        self._end_starting(False)
        for future in self._launches.values():
            if not future.done():
                future.set_exception(OSError("the worker fork server exited"))
        # Workers outlive a dead zygote but nobody reaps them for us any more.
        for pid, future in list(self._exits.items()):
            asyncio.get_running_loop().create_task(_watch_orphan(pid, future))
        if not self._closed:
            log.warning("worker fork server exited; restarting it")
            await self._restart()

    async def _restart(self) -> None:
        if self._process is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._process.wait(), 5)
        if not self._closed:
            await self.start()

    async def _started(self) -> bool:
        """Start the fork server for the first launch; False when it cannot start."""
        try:
            await self.start()
        except Exception:
            log.exception("the worker fork server could not start; launching workers cold")
            return False
        return True

    def _end_starting(self, ready: bool) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.set_result(ready)

    async def launch(
        self, spec: WorkerProcessSpec, first_frame: Callable[[], bytes] | None = None
    ) -> ForkedWorker | None:
        """Fork a worker for `spec`, or None when the fork server cannot serve it now.

        `first_frame()` is built while the fork server hands the worker its pipes and is
        written to the worker's stdin before anything else.
        """
        if not can_serve(spec):
            return None
        if self._starting is None and not self._closed and not await self._started():
            return None
        if self._is_stopped():
            self._replace("is stopped")
            return None
        if not self._ready and self._starting is not None and not self._starting.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._starting), STARTING_WAIT_S)
        if not self._ready or self._socket is None or self._closed:
            return None
        loop = asyncio.get_running_loop()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        launch_id = secrets.token_hex(8)
        pid_future: asyncio.Future = loop.create_future()
        self._launches[launch_id] = pid_future
        packet = json.dumps(
            {
                "launchId": launch_id,
                "envelope": spec.env[LAUNCH_ENV],
                "cwd": spec.cwd or "/",
                "env": _extra_env(spec),
            }
        ).encode("utf-8")
        try:
            socket.send_fds(self._socket, [packet], [stdin_r, stdout_w, stderr_w])
        except OSError:
            self._launches.pop(launch_id, None)
            for fd in (stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w):
                os.close(fd)
            return None
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
        unwritten = _write_ahead(stdin_w, _built(first_frame))
        exit_future: asyncio.Future = loop.create_future()
        pid = await self._fork_reply(pid_future)
        if pid is None:
            self._launches.pop(launch_id, None)
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            return None
        if pid in self._early_exits:
            exit_future.set_result(self._early_exits.pop(pid))
        elif self._closed:
            # close() ran while this reply was on its way to us and handed the exits it
            # knew to watchers: nobody would ever report this one.
            loop.create_task(_watch_orphan(pid, exit_future))
        else:
            self._exits[pid] = exit_future
        stdout = await _reader_for(stdout_r)
        stderr = await _reader_for(stderr_r)
        stdin = await _writer_for(stdin_w)
        if unwritten:
            stdin.write(unwritten)
        return ForkedWorker(pid, stdin, stdout, stderr, exit_future)

    async def _fork_reply(self, pid_future: asyncio.Future) -> int | None:
        """The forked worker's pid; None when the fork server cannot answer (a stopped
        or hung one is replaced: the launch goes on as a cold spawn meanwhile)."""
        deadline = asyncio.get_running_loop().time() + FORK_REPLY_TIMEOUT_S
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(pid_future), STALL_CHECK_S)
            except OSError:
                return None  # it exited; its reader restarts it
            except TimeoutError:
                pass
            if self._is_stopped():
                self._replace("is stopped")
                return None
            if asyncio.get_running_loop().time() > deadline:
                self._replace(f"did not answer a launch within {FORK_REPLY_TIMEOUT_S:.0f} s")
                return None

    def _is_stopped(self) -> bool:
        process = self._process
        if process is None or process.returncode is not None:
            return False
        try:
            return psutil.Process(process.pid).status() == psutil.STATUS_STOPPED
        except psutil.Error:
            return False

    def _replace(self, why: str) -> None:
        """Kill the fork server (and its spare) so that its reader starts a new one."""
        process = self._process
        if process is None or process.returncode is not None or self._closed:
            return
        log.warning("worker fork server (PID %d) %s; replacing it", process.pid, why)
        self._ready = False  # launches spawn cold until the new one is ready
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    async def close(self) -> None:
        self._closed = True
        self._end_starting(False)
        standby, self._standby = self._standby, None
        if standby is not None:
            standby.control.close()  # it reads end-of-file and exits
            with contextlib.suppress(Exception):
                await asyncio.wait_for(standby.process.wait(), 5)
        if self._socket is not None:
            self._socket.close()
        if self._reader is not None:
            self._reader.cancel()
        for future in self._launches.values():
            if not future.done():
                future.set_exception(OSError("the worker fork server was closed"))
        self._launches.clear()
        # Nobody reports these workers' exits any more: watch them instead.
        for pid, future in list(self._exits.items()):
            asyncio.get_running_loop().create_task(_watch_orphan(pid, future))
        self._exits.clear()
        process = self._process
        if process is None or process.returncode is not None:
            return
        # Its socket closed, the fork server ends its spare and exits: wait for that, so
        # that the host leaves no process behind (each holds the host log open). One
        # that is stopped or does not end in time is killed with its process group.
        if not self._is_stopped():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), CLOSE_WAIT_S)
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 5)


def _built(first_frame: Callable[[], bytes] | None) -> bytes:
    """The first frame, or nothing when it cannot be built (the launch goes on: the
    worker then gets its answer at worker.ready)."""
    if first_frame is None:
        return b""
    try:
        return first_frame()
    except Exception:
        log.exception("worker.ready's answer could not be prepared at launch")
        return b""


def _write_ahead(fd: int, data: bytes) -> bytes:
    """Write what the empty pipe `fd` takes at once; returns the rest."""
    if not data:
        return data
    os.set_blocking(fd, False)
    try:
        written = os.write(fd, data)
    except BlockingIOError:
        written = 0
    except BrokenPipeError:
        # The worker already died (at its workflow's import, say): nothing to write; its
        # exit status comes from the fork server as for any other worker.
        return b""
    return data[written:]


async def _reader_for(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_WORKER_FRAME_BYTES + 1)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader


async def _writer_for(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", buffering=0)
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)


async def _watch_orphan(pid: int, future: asyncio.Future) -> None:
    """Resolve the exit of a worker whose fork server died (exit code unknown: -1)."""
    while psutil.pid_exists(pid):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        await asyncio.sleep(0.05)
    if not future.done():
        future.set_result(-1)
