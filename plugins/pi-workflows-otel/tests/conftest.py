"""What the plugin's tests share."""

from __future__ import annotations

import pytest

BRANCH_EXECUTOR = """from pi_workflows.plugin import hookimpl

ANSWERS = {
    "classify": {"route": "continue", "reason": "The task is clear."},
    "continue_lane": {"summary": "Tidied the README."},
}


class Scripted:
    def run_agent_step(self, request, signal):
        return {
            "output": ANSWERS[request["contract"]["nodeId"]],
            "provider": "local",
            "model": "tiny-1",
            "usage": {"input": 120, "output": 7},
        }


@hookimpl
def piw_register_agent_executors(register):
    register("scripted", Scripted)
"""


@pytest.fixture
def branch_executor() -> str:
    """The source of a plugin whose agent executor ``scripted`` answers the built-in
    ``branch`` example's two agent steps, reporting provider ``local``, model ``tiny-1``
    and 120 input and 7 output tokens per step."""
    return BRANCH_EXECUTOR
