"""Process start identity: tells a live process from a recycled pid.

psutil is imported on first use: `host status` reads the lock file without it.
"""

from __future__ import annotations


def start_identity(pid: int) -> str | None:
    """`psutil-create-time:<seconds>` of a live process, or None when it is gone."""
    import psutil

    try:
        return f"psutil-create-time:{psutil.Process(pid).create_time():.3f}"
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def is_same_process(pid: int, identity: str) -> bool:
    return start_identity(pid) == identity


def is_running(pid: int, identity: str) -> bool:
    """The exact process is alive and not a zombie waiting to be reaped."""
    if not is_same_process(pid, identity):
        return False
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def is_stopped(pid: int, identity: str) -> bool:
    """The exact process is stopped (SIGSTOP, a terminal's Ctrl-Z): it acts on no signal
    but SIGKILL and SIGCONT until it runs again."""
    if not is_same_process(pid, identity):
        return False
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False
