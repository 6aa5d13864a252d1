"""The workflow engine: runs a definition against a run store (SPEC §12)."""

from .run_backend import OPERATIONS, RunBackend
from .runner import Engine, execute_command

__all__ = ["OPERATIONS", "Engine", "RunBackend", "execute_command"]
