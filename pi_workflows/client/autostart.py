"""Starting the host on demand (SPEC §5: client commands start it unless told not to)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from .. import settings
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
        process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,  # survives the CLI and its terminal
            close_fds=True,
        )
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


def _last_line(path: os.PathLike[str]) -> str:
    try:
        lines = [line for line in open(path, encoding="utf-8", errors="replace") if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no log"
