"""pi-workflows: a durable workflow host for multi-step agent workflows."""

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
    shell,
    switch,
    text_input,
    workflow,
)
from .hookspecs import hookimpl

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
    "shell",
    "switch",
    "text_input",
    "workflow",
]
