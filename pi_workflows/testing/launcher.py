"""The test kit's launcher: `pi-workflows` commands and hosts forked from a process that
imported them once.

A test suite starts hundreds of hosts and commands, and each pays for a new interpreter
and its imports before it does anything: about 90 ms of CPU for `run list` against a live
host, 260 ms for a host started and stopped, mostly imports
(`benchmarks/kit_launcher_bench.py`). The launcher is one process per test process that
imported the CLI and the host once; for each command it forks a child that takes the
request's environment, working directory and stdio (passed over SCM_RIGHTS), sets
`sys.argv` and `sys.path` as the interpreter would have, and runs
`pi_workflows.cli.main.main`: 10 ms for the same `run list`, 50 ms for the host. The child
ends as the interpreter would end it (non-daemon threads joined, atexit handlers run,
streams flushed, `SystemExit`'s status), without tearing its modules down. Its parent is
the launcher, which reports its pid and, later, its exit code as `subprocess` does
(negative: the signal that ended it).

It also forks the worker fork server-to-be of an in-process host
(`Launcher.fork_server_standby`): a host process forks its own as it starts, but the
test process has threads, and the host would otherwise start a new interpreter for it
(about 120 ms of CPU per host).

A request whose environment changes how an interpreter starts (a ``PYTHON*`` variable
other than ``PYTHONPATH`` unlike the launcher's own) is run with a real `exec`, and so is
every request when ``PI_WORKFLOWS_TEST_LAUNCHER=exec`` is set in the test process's
environment. The launcher stays single-threaded, so forking it is safe, and ends when its
test process does.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import locale
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import setproctitle

from ..fork_loop import CHILD, ForkLoop
from ..forked_child import exit_as_interpreter
from ..host.forkserver import ForkedChild, Standby
from .isolation import clean_environ

MODE_ENV = "PI_WORKFLOWS_TEST_LAUNCHER"
_CONTROL_FD_ENV = "PI_WORKFLOWS_TEST_LAUNCHER_FD"
_MAX_REQUEST_BYTES = 1024 * 1024
# Start-up settings a forked child can take on as a new interpreter would.
_ADOPTABLE = {"PYTHONPATH"}
# How long a child's end may come before the launcher's report of its exit status.
EXIT_REPORT_WAIT_S = 5.0


# --- the launcher process --------------------------------------------------------------


def _preload() -> None:
    # What commands and hosts import first thing; the children share it.
    from ..cli import (  # noqa: F401
        checkpoint_commands,
        decision_commands,
        host_commands,
        main,
        run_commands,
        state_commands,
    )
    from ..host import runtime  # noqa: F401
    from ..plugin_set import plugin_entry_points

    # The installed plugins' modules, imported (not registered): a host or fork server
    # whose home enables them registers them without importing them anew. One that fails
    # to import fails again, and is reported, where it is loaded.
    for entry_point in plugin_entry_points():
        with contextlib.suppress(Exception):
            importlib.import_module(entry_point.value.partition(":")[0].strip())

    # A fork server forked by a host retitles itself (setproctitle), which needs the
    # process's first environment block, as a new interpreter has it: set up here, before a
    # child replaces its environment with the request's.
    setproctitle.getproctitle()


def serve() -> int:
    control = socket.socket(fileno=int(os.environ.pop(_CONTROL_FD_ENV)))
    _preload()
    gc.freeze()  # the children's collections leave the preloaded objects (and their pages) alone
    loop = ForkLoop(control)
    while True:
        for event in loop.events():
            if event == CHILD:
                _report_exits(control)
                continue
            data, fds, _flags, _addr = socket.recv_fds(control, _MAX_REQUEST_BYTES, 4)
            if not data:
                return 0  # the test process is gone
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                loop.leave()
                if "standby" in request:
                    _become_standby(request, fds)
                _become_command(request, fds)  # each ends the child: never returns
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"request": request["request"], "pid": pid}).encode())


def _take_stdio(fds: list[int]) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)


def _become_command(request: dict[str, Any], fds: list[int]) -> NoReturn:
    _take_stdio(fds)
    os.chdir(request["cwd"])
    inherited = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(request["env"])
    added = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    added = [p for p in added if p not in inherited.split(os.pathsep)]
    # As the interpreter would have: the script's folder (or, for `-m`, the working
    # directory) first, then PYTHONPATH.
    sys.path[0:1] = [request["path0"], *added]
    sys.argv = [request["argv0"], *request["args"]]
    from ..cli.main import main

    exit_as_interpreter(lambda: main(request["args"]))


def _become_standby(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """A fork server-to-be, as a host process forks its own (`forkserver.fork_standby`),
    in the request's environment; its host gets the other end of its control socket."""
    control = socket.socket(fileno=fds.pop())
    _take_stdio(fds)
    os.environ.clear()
    os.environ.update(request["env"])
    from ..worker import zygote

    zygote.standby(control, request["standby"])


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(
            json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode()
        )


# --- the test process's side -----------------------------------------------------------


class LaunchedProcess:
    """A child of the launcher, used as a `subprocess.Popen` is: `pid`, `returncode`,
    `poll`, `wait`, `send_signal`, `terminate`, `kill`."""

    def __init__(self, launcher: Launcher, pid: int, args: list[str]) -> None:
        self._launcher = launcher
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._launcher.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._launcher.exit_code(self.pid, timeout=timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = code
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass  # it ended; its exit is on its way

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """A launcher process and this process's end of its socket (see the module's doc)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"import sys; from {__name__} import serve; sys.exit(serve())"],
            env={**self.env, _CONTROL_FD_ENV: str(theirs.fileno())},
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self._control = ours
        self._sending = threading.Lock()
        self._changed = threading.Condition()
        self._pids: dict[int, int] = {}  # request number -> pid
        self._exits: dict[int, int] = {}  # pid -> exit code
        self._next = 0
        self.alive = True
        threading.Thread(target=self._read, name="test launcher", daemon=True).start()

    def adopts(self, env: Mapping[str, str]) -> bool:
        """Whether a forked child can take on `env` as a new interpreter would."""
        keys = {k for k in (*env, *self.env) if k.startswith("PYTHON") and k not in _ADOPTABLE}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def launch(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        module: bool,
        stdio: list[int],
    ) -> LaunchedProcess:
        console = str(console_script())
        request: dict[str, Any] = {
            "args": list(args),
            "env": dict(env),
            "cwd": str(cwd),
            "argv0": str(Path(__file__).parents[1] / "__main__.py") if module else console,
            "path0": str(Path(cwd).resolve()) if module else str(Path(console).parent),
        }
        return LaunchedProcess(self, self._forked(request, stdio), list(args))

    def standby(
        self, *, env: Mapping[str, str], cwd: Path
    ) -> tuple[LaunchedProcess, socket.socket]:
        """A fork server-to-be in `env` that serves in `cwd` once told to, and the host's
        end of its control socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {"standby": str(cwd), "env": dict(env)}
        try:
            with open(os.devnull, "rb") as devnull:
                # Its stderr is this process's, as an exec'd fork server's would be.
                pid = self._forked(
                    request, [devnull.fileno(), devnull.fileno(), 2, theirs.fileno()]
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return LaunchedProcess(self, pid, ["--zygote"]), ours

    def fork_server_standby(self, env: Mapping[str, str], cwd: Path) -> Standby | None:
        """A fork server-to-be for a host that cannot fork its own (an in-process host
        shares its process with other threads), as `standby`; None when a child cannot
        take on `env`. Its exit status comes from this launcher, its parent."""
        if not self.adopts(env):
            return None
        process, control = self.standby(env=env, cwd=cwd)
        return Standby(ForkedChild(process.pid, lambda _pid: _reported_exit(process)), control)

    def _forked(self, request: dict[str, Any], fds: list[int]) -> int:
        """Send `request` with `fds`; the pid of the child forked for it."""
        with self._sending:
            self._next += 1
            number = request["request"] = self._next
            socket.send_fds(self._control, [json.dumps(request).encode()], fds)
        with self._changed:
            self._changed.wait_for(lambda: number in self._pids or not self.alive)
            if number not in self._pids:
                raise RuntimeError("the test kit's launcher process ended")
            return self._pids.pop(number)

    def exit_code(self, pid: int, *, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or not self.alive, timeout)
            if pid not in self._exits and not self.alive:
                raise RuntimeError("the test kit's launcher process ended")
            return self._exits.pop(pid, None)  # kept by its LaunchedProcess from now on

    def _read(self) -> None:
        while True:
            try:
                data = self._control.recv(65536)
            except OSError:
                data = b""
            with self._changed:
                if not data:
                    self.alive = False
                    self._changed.notify_all()
                    return
                message = json.loads(data)
                if "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                else:
                    self._pids[message["request"]] = message["pid"]
                    # A pid the system used again: the exit of its earlier owner is not this one's.
                    self._exits.pop(message["pid"], None)
                self._changed.notify_all()


_launcher: Launcher | None = None
_starting = threading.Lock()


def shared_launcher() -> Launcher | None:
    """This test process's launcher, or None when every command is to be exec'd.

    It is started with this process's environment (less its ``PI_WORKFLOWS_*``
    variables): a request's own environment is set in each child.
    """
    global _launcher
    if os.environ.get(MODE_ENV) == "exec":
        return None
    with _starting:
        if _launcher is None or not _launcher.alive:
            _launcher = Launcher(clean_environ())
        return _launcher


def _forking(env: Mapping[str, str]) -> Launcher | None:
    """The launcher, when a child forked from it can take on `env`; else None (exec)."""
    launcher = shared_launcher()
    return launcher if launcher is not None and launcher.adopts(env) else None


def _reported_exit(process: LaunchedProcess) -> int:
    """Its exit status as the launcher reports it; -1 (unknown, as for a worker whose fork
    server died) when the launcher is gone or does not report it in time."""
    try:
        return process.wait(EXIT_REPORT_WAIT_S)
    except (RuntimeError, subprocess.TimeoutExpired):
        return -1


def console_script() -> Path:
    """The `pi-workflows` console script beside this interpreter."""
    return Path(sys.executable).with_name("pi-workflows")


def _command(args: Sequence[str], module: bool) -> list[str]:
    if module:
        return [sys.executable, "-m", "pi_workflows", *args]
    return [str(console_script()), *args]


def start(
    args: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: IO[bytes], child: bool = False
) -> LaunchedProcess | subprocess.Popen[bytes]:
    """``python -m pi_workflows ARGS`` in the background, its output appended to `log`;
    with `child`, exec'd as a child of this process (which then reaps it)."""
    launcher = None if child else _forking(env)
    if launcher is None:
        return subprocess.Popen(
            _command(args, True),
            env=dict(env),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )
    with open(os.devnull, "rb") as devnull:
        stdio = [devnull.fileno(), log.fileno(), log.fileno()]
        return launcher.launch(args, env=env, cwd=cwd, module=True, stdio=stdio)


def run(
    args: Sequence[str], *, env: Mapping[str, str], cwd: Path, module: bool, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``pi-workflows ARGS`` to its end, as `subprocess.run(..., capture_output=True,
    text=True, stdin=DEVNULL)` would run it."""
    launcher = _forking(env)
    command = _command(args, module)
    if launcher is None:
        return subprocess.run(
            command,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )
    with (
        open(os.devnull, "rb") as devnull,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        process = launcher.launch(
            args,
            env=env,
            cwd=cwd,
            module=module,
            stdio=[devnull.fileno(), out.fileno(), err.fileno()],
        )
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise subprocess.TimeoutExpired(command, timeout, _text(out), _text(err)) from None
        return subprocess.CompletedProcess(command, code, _text(out), _text(err))


def _text(file: IO[bytes]) -> str:
    # As `subprocess` decodes with text=True: the locale's encoding, newlines made "\n".
    file.seek(0)
    text = file.read().decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")
