"""How the worker process of this pi_workflows is started: argv, environment, exit codes.

The core needs these without any plugin: the worker reads its envelope from
:data:`LAUNCH_ENV`, and the host's fork server recognises a launch of exactly this
command. The built-in ``piw_worker_process`` (``pi_workflows.builtin.launch``) returns it.
"""

from __future__ import annotations

import os
import sys

LAUNCH_ENV = "PI_WORKFLOWS_WORKER_LAUNCH"
EXIT_OK = 0
EXIT_FAILED = 1
# The run's claim was lost, or the host let its lease lapse (`worker.lease_fence`).
EXIT_CLAIM_LOST = 3


def worker_argv(python: str | None = None) -> list[str]:
    """The built-in worker command (`--zygote` turns it into the fork server)."""
    return [python or sys.executable, "-m", "pi_workflows.worker"]


def is_worker_command(argv: list[str]) -> bool:
    """True when `argv` runs this package's worker (with any Python)."""
    return bool(argv) and argv == worker_argv(argv[0])


def worker_pythonpath() -> str:
    """PYTHONPATH that lets a worker import this very pi_workflows, even from a tree."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
