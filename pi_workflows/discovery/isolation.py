"""Loading one workflow file in a forked child with a deadline and a memory limit.

Importing a workflow runs its code, which may loop, exit, allocate without bound or kill
its own process. The child answers with the file's JSON description; whatever the file
does, the caller gets an answer (possibly "broken: why") within the deadline, and the
child never outlives the caller.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import settings
from ..parent_death import die_with_parent


def load_timeout_s() -> float:
    return settings.number("discovery_timeout_s")


def memory_limit_bytes() -> int:
    return int(settings.number("discovery_memory_mb") * 1024 * 1024)


def describe_isolated(
    name: str, path: Path, describe: Callable[[str, Path], dict[str, Any]]
) -> dict[str, Any]:
    """`describe(name, path)` run in a forked child; a broken answer if the child fails."""
    timeout_s, memory = load_timeout_s(), memory_limit_bytes()
    parent = os.getpid()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _answer_in_child(parent, write_end, memory, lambda: describe(name, path))
    os.close(write_end)
    try:
        data, finished = _read_until(read_end, time.monotonic() + timeout_s)
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # done or overdue: it has nothing left to say
        _, status = os.waitpid(pid, 0)
    if not finished:
        return _broken(name, path, f"did not finish loading within {timeout_s:g} s")
    try:
        return json.loads(data)
    except ValueError:
        return _broken(name, path, f"ended its process ({_how(status)}) while loading")


def _answer_in_child(
    parent: int, write_end: int, memory: int, describe: Callable[[], dict[str, Any]]
) -> None:
    code = 0
    try:
        die_with_parent(parent)
        _own_stdio()
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        data = json.dumps(describe(), sort_keys=True).encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view) :]
    except BaseException:  # whatever happens here, the parent reports a broken file
        code = 1
    os._exit(code)


def _own_stdio() -> None:
    """Give the child stdio of its own (/dev/null): a daemon a workflow file starts at
    import would otherwise inherit the caller's stdout and hold it open, so a command
    waiting for that output's end (the CLI's resolver) would wait for the daemon."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to `fd` until EOF; (data, False) if the deadline came first."""
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"", False
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _broken(name: str, path: Path, why: str) -> dict[str, Any]:
    return {"name": name, "source": None, "error": f"{path}: {why}"}
