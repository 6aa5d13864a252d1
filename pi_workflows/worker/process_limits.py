"""A worker's niceness and resource limits (``WorkerProcessSpec.nice``/``rlimits``).

The host puts what the launch asks for in ``PI_WORKFLOWS_WORKER_LIMITS`` (JSON: the
niceness to run at, absolute, and the limits); the built-in worker applies it first thing,
whether it was forked from the fork server or started cold, so workflow code never runs
without it. The niceness is absolute so that applying it twice changes nothing.
A command of a plugin's own is given the same by the host right after it starts.
"""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Mapping

LIMITS_ENV = "PI_WORKFLOWS_WORKER_LIMITS"


def encoded(nice: int, rlimits: Mapping[str, tuple[int, int]]) -> str | None:
    """The variable's value for a worker `nice` above this process, or None for none."""
    if not nice and not rlimits:
        return None
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    return json.dumps({"nice": target, "rlimits": {k: list(v) for k, v in rlimits.items()}})


def apply_own() -> None:
    """In the worker: apply what ``PI_WORKFLOWS_WORKER_LIMITS`` says, if anything."""
    text = os.environ.get(LIMITS_ENV)
    if not text:
        return
    wanted = json.loads(text)
    if os.getpriority(os.PRIO_PROCESS, 0) < wanted["nice"]:
        os.setpriority(os.PRIO_PROCESS, 0, wanted["nice"])
    for name, (soft, hard) in wanted["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (_limit(soft), _limit(hard)))


def apply_to(pid: int, text: str) -> None:
    """From the host: apply the encoded limits to a started process of a plugin's own."""
    import psutil  # the host's; a worker never needs it

    wanted = json.loads(text)
    process = psutil.Process(pid)
    if process.nice() < wanted["nice"]:
        process.nice(wanted["nice"])
    for name, (soft, hard) in wanted["rlimits"].items():
        process.rlimit(getattr(resource, name), (_limit(soft), _limit(hard)))


def _limit(value: int) -> int:
    return resource.RLIM_INFINITY if value == -1 else value
