"""Where state lives: the home directory, its layout and its permission checks (SPEC §4)."""

from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from .canonical import sha256_hex
from .errors import ReadOnlyHomeError, UnsafeHomeError

APP_NAME = "pi-workflows"
HOME_ENV = "PI_WORKFLOWS_HOME"
DATABASE_ENV = "PI_WORKFLOWS_DATABASE"
CONFIG_ENV = "PI_WORKFLOWS_CONFIG_DIR"


@dataclass(frozen=True)
class Home:
    """The paths of one installation's state."""

    root: Path

    @property
    def database_path(self) -> Path:
        return self.root / "state.sqlite"

    @property
    def host_dir(self) -> Path:
        return self.root / "host"

    @property
    def socket_path(self) -> Path:
        return self.host_dir / "host.sock"

    @property
    def lock_path(self) -> Path:
        return self.host_dir / "host.lock.json"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"


def machine_name() -> str:
    return socket.gethostname()


def home_key(home: Home) -> str:
    """Names a home on this machine in a shared database without storing its path."""
    return sha256_hex(f"{machine_name()}\0{home.root}")


def default_home_path() -> Path:
    import platformdirs  # imported here: a command given --home or the variable skips it

    return Path(platformdirs.user_data_dir(APP_NAME))


def config_dir() -> Path:
    """`<config>`: channel configuration and user workflows (`<config>/workflows`)."""
    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME))


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Home:
    """The home from `--home`, else `PI_WORKFLOWS_HOME`, else the platform default."""
    raw = explicit or os.environ.get(HOME_ENV) or default_home_path()
    return Home(Path(raw).expanduser().resolve())


def ensure_private_dir(path: Path) -> None:
    """Create `path` with mode 0700 if missing, then refuse it if it is unsafe."""
    if not path.exists():
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            raise _not_writable(path) from None
        os.chmod(path, 0o700)
    check_private_dir(path)


def check_writable(path: Path) -> None:
    """Refuse a directory this process cannot write, in one line that says why."""
    if not os.access(path, os.W_OK | os.X_OK):
        raise _not_writable(path)


def _not_writable(path: Path) -> ReadOnlyHomeError:
    """`path` (or the nearest directory of it that exists) cannot be written."""
    blocker = path
    while not blocker.exists() and blocker != blocker.parent:
        blocker = blocker.parent
    if os.statvfs(blocker).f_flag & os.ST_RDONLY:
        why = "is on a read-only filesystem; remount it read-write"
    else:
        why = f"is not writable by you (uid {os.getuid()}); check its permissions"
    return ReadOnlyHomeError(
        f"The pi-workflows home cannot be written: {blocker} {why}, or use another home "
        f"with --home or {HOME_ENV}."
    )


def check_private_dir(path: Path) -> None:
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeHomeError(f"State path {path} is not a directory; choose another --home.")
    if info.st_uid != os.getuid():
        raise UnsafeHomeError(
            f"State directory {path} is owned by uid {info.st_uid}, not by you (uid "
            f"{os.getuid()}); use a home of your own with --home or {HOME_ENV}."
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeHomeError(
            f"State directory {path} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}); run 'chmod 700 {path}' and try again."
        )


def prepare_home(home: Home) -> Home:
    """Create the home and its host directory privately; refuse unsafe ones."""
    ensure_private_dir(home.root)
    ensure_private_dir(home.host_dir)
    check_writable(home.root)
    check_writable(home.host_dir)
    return home
