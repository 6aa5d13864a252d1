"""pi-workflows: a durable workflow host for multi-step agent workflows.

The authoring API and `hookimpl` are imported on first use, so a command line call
that needs neither (`pi-workflows --version`, `run list`) does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "action",
    "agent",
    "checkpoint",
    "choice",
    "compute",
    "decision",
    "edge",
    "hookimpl",
    "human_decision",
    "idempotent_effect",
    "manual_effect",
    "notify",
    "route",
    "shell",
    "switch",
    "text_input",
    "workflow",
]
_AUTHORING = frozenset(__all__) - {"__version__", "hookimpl"}

if TYPE_CHECKING:
    from .authoring import (
        action,
        agent,
        checkpoint,
        choice,
        compute,
        decision,
        edge,
        human_decision,
        idempotent_effect,
        manual_effect,
        notify,
        route,
        shell,
        switch,
        text_input,
        workflow,
    )
    from .hookspecs import hookimpl


def __getattr__(name: str) -> Any:
    if name in _AUTHORING:
        value = getattr(importlib.import_module(".authoring", __name__), name)
    elif name == "hookimpl":
        value = importlib.import_module(".hookspecs", __name__).hookimpl
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
