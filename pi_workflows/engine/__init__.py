"""The workflow engine: runs a definition against a run store (SPEC §12)."""

from .runner import Engine, execute_command
from .store import OPERATIONS, RunStore

__all__ = ["OPERATIONS", "Engine", "RunStore", "execute_command"]
