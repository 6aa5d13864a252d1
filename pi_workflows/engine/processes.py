"""Processes a node attempt starts: each leads its own process group, and the group is
registered with the host before it runs any user command (SPEC §7.4a).

The command is started behind a tiny `/bin/sh` gate that waits for one line on its
stdin before it `exec`s the real command (same pid, same start time). In between, the
group is registered through the attempt's registry; if that fails, or the worker dies
first, the gate reads end-of-file and exits without running anything. Executors (shell
actions, the `command` and `pi` agent executors) start their commands with
:func:`start_registered`.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterator
from typing import Any, Protocol

GATE = 'read -r _ || exit 125; exec "$@"'
GO = b"go\n"


class ProcessRegistry(Protocol):
    def register(self, process_group: int, kind: str) -> None:
        """Record the group durably; raise to refuse it (the command never runs)."""

    def unregister(self, process_group: int) -> None:
        """The group's command ended and its leftovers were stopped."""


class _Current(threading.local):
    registry: ProcessRegistry | None = None


_current = _Current()


@contextlib.contextmanager
def registering_with(registry: ProcessRegistry) -> Iterator[None]:
    """Processes this thread starts inside the block are registered with `registry`."""
    previous, _current.registry = _current.registry, registry
    try:
        yield
    finally:
        _current.registry = previous


def start_registered(
    argv: list[str], *, kind: str, keep_stdin: bool = False, **popen: Any
) -> subprocess.Popen:
    """Start `argv` in a new session (its own process group), registered first.

    stdin is always a pipe; with `keep_stdin` it stays open for the caller, otherwise
    the command reads end-of-file. Without a registry (an engine run in process, with no
    host) the command starts at once.
    """
    process = subprocess.Popen(
        ["/bin/sh", "-c", GATE, "pi-workflows-gate", *argv],
        stdin=subprocess.PIPE,
        start_new_session=True,
        **popen,
    )
    assert process.stdin is not None
    registry = _current.registry
    try:
        if registry is not None:
            registry.register(process.pid, kind)
        process.stdin.write(GO)
        process.stdin.flush()
    except BaseException:
        process.stdin.close()
        process.wait()
        raise
    if not keep_stdin:
        process.stdin.close()
    return process


def unregister(process: subprocess.Popen) -> None:
    """Tell the host the group of a finished command is gone (best effort)."""
    registry = _current.registry
    if registry is None:
        return
    with contextlib.suppress(Exception):
        registry.unregister(process.pid)
