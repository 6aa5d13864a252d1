"""One node attempt as the engine and the node-kind handlers share it: its record, the
two ways a handler hands the attempt back unfinished, and the JSON check every value a
node produces passes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .. import worker_memory
from ..authoring.nodes import Node
from ..errors import PiWorkflowsError
from ..limits import MAX_OUTPUT_BYTES, checked_json
from .agents import AgentTranscript
from .context import AbortSignal


@dataclass
class Attempt:
    node_id: str
    attempt_id: str
    node: Node
    started_at: int
    signal: AbortSignal = field(default_factory=AbortSignal)
    prompt: str | None = None
    action: dict[str, Any] | None = None
    effect: dict[str, Any] | None = None
    effect_result: Any = None
    has_effect_result: bool = False
    transcript: AgentTranscript | None = None
    # An agent output the step's checks accepted while the executor was still running.
    accepted_output: tuple[Any] | None = None
    # A headless agent step: the executor's name and what it reported of who answered.
    agent: dict[str, Any] | None = None


class AwaitInteraction(Exception):
    """The attempt's agent step went to the run's origin session: the run waits for it."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id


class EffectAmbiguous(Exception):
    """The action's effect may or may not have happened: the run parks for an operator."""


def describe(error: BaseException) -> str:
    if isinstance(error, PiWorkflowsError):
        return str(error)
    text = str(error)
    described = f"{type(error).__name__}: {text}" if text else type(error).__name__
    if isinstance(error, MemoryError) and worker_memory.note():
        return f"{described} ({worker_memory.note()})"
    return described


def as_json(value: Any, what: str) -> Any:
    """`value` as it survives a JSON round trip; tuples become lists, the rest is refused,
    and so is a value over the output limits (docs/operations.md)."""
    return json.loads(checked_json(value, what, MAX_OUTPUT_BYTES))
