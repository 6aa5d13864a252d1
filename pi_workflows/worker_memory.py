"""The workers' memory limit (setting `worker_memory`, `PI_WORKFLOWS_WORKER_MEMORY`).

A worker sets it as its address-space limit (RLIMIT_AS) before it loads the workflow, so
the workflow's code, the engine and each process a node starts (each on its own) are held
to it. An allocation past it fails with MemoryError: in node code the node fails with an
error naming the limit (`note`); anywhere else the worker exits with
`EXIT_OUT_OF_MEMORY` and the host names the limit where it says why the worker stopped.
"""

from __future__ import annotations

import os
import re
import resource

ENV = "PI_WORKFLOWS_WORKER_MEMORY"
EXIT_OUT_OF_MEMORY = 4
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT])(?:I?B)?", re.IGNORECASE)


def size_bytes(text: str) -> int:
    """'512M', '2G', '1.5GiB' as bytes; ValueError for anything else or below 1 MiB."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError("a size such as 512M or 2G")
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size < _UNITS["M"]:
        raise ValueError("a size of at least 1M")
    return size


def apply_from_environment() -> None:
    """In the worker process: hold it to the limit its host's settings give, if any.
    (The host's environment carries every setting its workers need: docs/operations.md.)"""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return
    # A launch plugin may have set a tighter one already (`WorkerProcessSpec.rlimits`,
    # applied first): the tighter wins, and a limit is never raised.
    limit = size_bytes(raw)
    for current in resource.getrlimit(resource.RLIMIT_AS):
        if current != resource.RLIM_INFINITY:
            limit = min(limit, current)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def note() -> str:
    """What a MemoryError in this process means, when a limit is set ('' otherwise)."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return ""
    return f"the worker's memory limit ({ENV}, {limit >> 20} MiB) was reached"
