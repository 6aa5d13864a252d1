"""Scripted model replies that act on a pi-workflows step contract found in the prompt.

The step prompt carries the ids the `workflow` tool needs (`"step":"…","attempt":"…"`); these
replies read them from the newest request, as a real model reads them from its context.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.pi.model_server import ModelRequest, Reply, ToolCall, ToolCalls

_CONTRACT = re.compile(r'"action":"submit","step":"([^"]+)","attempt":"([^"]+)"')


def step_ids(request: ModelRequest) -> tuple[str, str]:
    """(step id, attempt id) of the newest step contract the model has seen."""
    found = _CONTRACT.findall(request.all_text())
    assert found, f"no step contract in the model's context:\n{request.all_text()[:2000]}"
    return found[-1]


def workflow_call(action: str, call_id: str | None = None, **fields: Any) -> Callable[..., Reply]:
    """A reply calling the `workflow` tool with `action`, the current ids and `fields`."""

    def reply(request: ModelRequest) -> Reply:
        step, attempt = step_ids(request)
        arguments = {"action": action, "step": step, "attempt": attempt, **fields}
        return ToolCalls(ToolCall("workflow", arguments, id=call_id))

    return reply


def submit(output: Any, call_id: str | None = None) -> Callable[..., Reply]:
    """A reply submitting `output` for the current step."""
    return workflow_call("submit", call_id, output=output)
