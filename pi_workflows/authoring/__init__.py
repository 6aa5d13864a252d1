"""The authoring API: the functions a `<name>.workflow.py` file calls (SPEC §12)."""

from .graph import Edge, Switch, Workflow, edge, switch, workflow
from .nodes import (
    Choice,
    Effect,
    Node,
    TextInput,
    action,
    agent,
    checkpoint,
    choice,
    compute,
    decision,
    human_decision,
    idempotent_effect,
    manual_effect,
    notify,
    shell,
    text_input,
)
from .validate import validate_graph

__all__ = [
    "Choice",
    "Edge",
    "Effect",
    "Node",
    "Switch",
    "TextInput",
    "Workflow",
    "action",
    "agent",
    "checkpoint",
    "choice",
    "compute",
    "decision",
    "edge",
    "human_decision",
    "idempotent_effect",
    "manual_effect",
    "notify",
    "shell",
    "switch",
    "text_input",
    "validate_graph",
    "workflow",
]
