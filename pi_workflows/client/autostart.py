"""Starting the host on demand (SPEC §5: client commands start it unless told not to)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from .. import forked_child
from ..errors import HostUnavailableError
from ..home import DATABASE_ENV, Home, prepare_home
from .connection import HostConnection

STARTUP_DEADLINE_S = 20.0


def connect(
    home: Home, database_url: str | None, *, autostart: bool = True, client_id: str | None = None
) -> HostConnection:
    """Connect to the home's host, starting one in the background if allowed."""
    try:
        return HostConnection(home.socket_path, client_id=client_id)
    except HostUnavailableError:
        if not autostart:
            raise HostUnavailableError(
                f"No workflow host is running for {home.root}; start one with "
                "'pi-workflows host start' or drop --no-autostart."
            ) from None
    start_background_host(home, database_url)
    return HostConnection(home.socket_path, client_id=client_id)


def start_background_host(home: Home, database_url: str | None) -> int:
    """Spawn `pi-workflows host run` detached and wait until it accepts connections."""
    # A bad setting is refused here, in the user's terminal, not in the host's log.
    # Imported here: every client command imports this module, few start a host.
    from .. import settings

    settings.resolve()
    prepare_home(home)
    home.logs_dir.mkdir(mode=0o700, exist_ok=True)
    log_path = home.logs_dir / "host.log"
    fd = os.open(log_path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    argv = [sys.executable, "-m", "pi_workflows", "--home", str(home.root)]
    argv += ["host", "run", "--log-file", str(log_path)]
    # The URL may hold a password: any local user reads a command line (ps), only this
    # user reads a process's environment. No URL means the home's SQLite file, so an
    # inherited variable must not point the host elsewhere.
    env = {key: value for key, value in os.environ.items() if key != DATABASE_ENV}
    if database_url:
        env[DATABASE_ENV] = database_url
    try:
        process = _started(argv, env, fd)
    finally:
        os.close(fd)
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while time.monotonic() < deadline:
        try:
            HostConnection(home.socket_path).close()
            return process.pid
        except HostUnavailableError:
            pass
        code = process.poll()
        if code is not None:
            # A host that lost the race to another starting host is fine.
            try:
                HostConnection(home.socket_path).close()
                return process.pid
            except HostUnavailableError:
                raise HostUnavailableError(
                    f"The workflow host exited with status {code} while starting: "
                    f"{_last_line(log_path)}"
                ) from None
        time.sleep(0.05)
    raise HostUnavailableError(
        f"The workflow host did not start within {STARTUP_DEADLINE_S:.0f} s; see {log_path}."
    )


def _started(
    argv: list[str], env: dict[str, str], log_fd: int
) -> ForkedHost | subprocess.Popen[bytes]:
    """`argv` in the background, in its own session (it survives the command and its
    terminal), its output appended to `log_fd`. A command with one thread forks it (see
    `forked_child.command_entry`): the child starts with the command's imports and plugins
    (a first command that starts the host waits ~55 ms less, 470 -> 415 ms)."""
    entry = forked_child.command_entry
    if entry is None or not _may_fork():
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
        )
    # What this process has written but not flushed would be written by the child too.
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_host(argv, env, log_fd, entry)
    return ForkedHost(pid)


def _may_fork() -> bool:
    """One thread and no running event loop: the child copies nothing half-done."""
    if threading.active_count() != 1:
        return False
    asyncio = sys.modules.get("asyncio")
    return asyncio is None or asyncio._get_running_loop() is None


def _become_host(
    argv: list[str], env: dict[str, str], log_fd: int, entry: Callable[[list[str]], object]
) -> NoReturn:
    """In the forked child: become what `argv` exec'd would be, run it, and exit (never
    back into the command that forked it, whatever fails)."""

    def run() -> object:
        forked_child.detach((os.open(os.devnull, os.O_RDONLY), log_fd, log_fd))
        import setproctitle

        # `ps` shows the command it stands for. Set before the environment is replaced:
        # setproctitle takes over the process's first environment block.
        title = " ".join(argv)
        setproctitle.setproctitle(title)
        if _command_line() != title:
            # Not retitled: it would show the command's arguments for as long as it runs
            # (a database URL with its password among them). Start the host anew instead.
            os.execve(argv[0], argv, env)
        os.environ.clear()
        os.environ.update(env)
        # `python -m pi_workflows ARGS` has the working directory first on its path.
        sys.path[0] = os.getcwd()
        args = argv[3:]
        sys.argv = [str(Path(__file__).parents[1] / "__main__.py"), *args]
        return entry(args)

    forked_child.exit_as_interpreter(run)


def _command_line() -> str:
    """This process's command line as `ps` reads it (its first string)."""
    with open("/proc/self/cmdline", "rb") as cmdline:
        return cmdline.read().split(b"\0", 1)[0].decode(errors="replace")


class ForkedHost:
    """The forked host, with the part of `subprocess.Popen` this module uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _last_line(path: os.PathLike[str]) -> str:
    try:
        lines = [line for line in open(path, encoding="utf-8", errors="replace") if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no log"
