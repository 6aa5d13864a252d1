"""Agent steps (engine.md §4): prompt contract, tolerant output parsing, executors.

An interactive run asks its origin session through the store and waits; a headless run
hands the prompt to an agent executor registered with `piw_register_agent_executors`
(chosen by ``PI_WORKFLOWS_AGENT_EXECUTOR``, default ``command``). An executor is any
object with ``run_agent_step(request, signal) -> {"output": ...}``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Protocol

from .. import plugins
from ..authoring.nodes import DEFAULT_EXPECTED_OUTPUT, Node
from ..errors import PiWorkflowsError
from ..records import AgentStepRequest, AgentStepResult
from .context import AbortSignal

EXECUTOR_ENV = "PI_WORKFLOWS_AGENT_EXECUTOR"
DEFAULT_EXECUTOR = "command"
MAX_PARSE_CANDIDATES = 64
_FENCED = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


class AgentExecutorError(PiWorkflowsError):
    """No usable agent executor, or the executor failed."""


class AgentExecutor(Protocol):
    """The executor contract is documented at ``piw_register_agent_executors``."""

    def run_agent_step(self, request: AgentStepRequest, signal: AbortSignal) -> AgentStepResult:
        """Run one step; return ``{"output": <JSON or text>}``; stop when `signal` aborts."""


def step_prompt(
    workflow_name: str, node_id: str, attempt_id: str, node: Node, authored: str
) -> str:
    """The authored prompt followed by the step contract block."""
    expected = node.expected_output or DEFAULT_EXPECTED_OUTPUT
    return (
        f"{authored.rstrip()}\n\n---\n"
        f"Workflow step contract (workflow: {workflow_name}, step: {node_id}, "
        f"attempt: {attempt_id})\n\n"
        "Complete this step by calling the `workflow` tool exactly once with:\n"
        f'{{"action":"submit","step":"{node_id}","attempt":"{attempt_id}",'
        '"output":<your result>}\n'
        f"Expected output: {expected}\n"
        "The step is complete only after the workflow tool accepts the output.\n"
        "If the tool reports a validation error, correct the output and call it again."
    )


def _balanced_candidates(text: str) -> list[str]:
    """Balanced `{…}` / `[…]` spans, in order of their start, ignoring brackets in strings."""
    found: list[str] = []
    for start, opener in ((i, c) for i, c in enumerate(text) if c in "{["):
        closer = "}" if opener == "{" else "]"
        depth, in_string, escaped = 0, False, False
        for end in range(start, len(text)):
            char = text[end]
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
                continue
            if char == '"':
                in_string = True
            elif char == opener:
                depth += 1
            elif char == closer:
                depth -= 1
                if depth == 0:
                    found.append(text[start : end + 1])
                    break
        if len(found) >= MAX_PARSE_CANDIDATES:
            break
    return found


def parse_output(output: Any) -> Any:
    """Tolerant parse of a text output: JSON, a fenced JSON block, the first JSON span."""
    if not isinstance(output, str):
        return output
    candidates = [output.strip(), *(m.strip() for m in _FENCED.findall(output))]
    candidates += _balanced_candidates(output)
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return output


def headless_executor() -> AgentExecutor:
    name = os.environ.get(EXECUTOR_ENV, DEFAULT_EXECUTOR)
    factories = plugins.agent_executor_factories()
    if name not in factories:
        known = ", ".join(sorted(factories)) or "none"
        raise AgentExecutorError(
            f"No agent executor named {name!r} (registered: {known}); set {EXECUTOR_ENV}."
        )
    return factories[name]()
