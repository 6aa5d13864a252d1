"""Stopping the process groups a run left behind (SPEC §7.4a).

A worker registers every group it starts (shell actions, agent executors) before the
group runs any user command. When the worker is gone — it crashed, was cancelled,
paused or handed off, or its host died — the host stops the groups still registered:
SIGTERM, then SIGKILL after a grace period, before the run can be claimed again. So a
node never executes twice at once, and nothing outlives its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket

import psutil

from ..storage import StateStore, run_processes
from ..storage.run_processes import RegisteredGroup
from .process_identity import start_identity

KILL_GRACE_S = 2.0
POLL_S = 0.05

log = logging.getLogger(__name__)


def this_machine() -> str:
    return socket.gethostname()


async def stop_orphaned_groups(
    store: StateStore, run_id: str | None = None, grace_s: float = KILL_GRACE_S
) -> int:
    """Stop the registered groups on this machine whose worker is gone; returns how many.

    With `run_id`, only that run's groups; otherwise every run's (host startup).
    """
    groups = run_processes.orphaned_groups(this_machine(), run_id)
    if not groups:
        return 0
    targets = {group.process_group for group in groups if _may_be_ours(group)}
    for group in targets:
        _signal_group(group, signal.SIGTERM)
    deadline = asyncio.get_running_loop().time() + grace_s
    # Scanning the process table takes milliseconds: off the event loop.
    while (alive := await asyncio.to_thread(_groups_with_live_members, targets)) and (
        asyncio.get_running_loop().time() < deadline
    ):
        await asyncio.sleep(POLL_S)
    for group in alive:
        _signal_group(group, signal.SIGKILL)
    with store.transaction():
        run_processes.mark_killed([group.row_id for group in groups])
    if targets:
        log.info("stopped %d process group(s) left behind by workers", len(targets))
    return len(targets)


def _may_be_ours(group: RegisteredGroup) -> bool:
    """False when the group leader's pid now belongs to another process.

    The kernel never hands out a pid that is still some group's id, so a reused leader
    pid means every member of our group is gone; a missing leader may have left members.
    """
    identity = start_identity(group.process_group)
    return identity is None or identity == group.start_identity


def _groups_with_live_members(groups: set[int]) -> set[int]:
    """The groups that still have a member that is not a zombie."""
    if not groups:
        return set()
    alive: set[int] = set()
    for process in psutil.process_iter(["status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(process.pid)
            if group in groups:
                alive.add(group)
    return alive


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)
