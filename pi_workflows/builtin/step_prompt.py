"""Built-in `piw_step_prompt`: the authored prompt followed by the step contract block.

The block names the step, says how to submit it through the `workflow` tool and what
output is expected, so a model in a chat session or behind a headless executor can
finish the step the same way.
"""

from __future__ import annotations

from ..authoring.nodes import DEFAULT_EXPECTED_OUTPUT
from ..hookspecs import hookimpl
from ..records import StepContract


@hookimpl
def piw_step_prompt(contract: StepContract, authored: str) -> str:
    node_id, attempt_id = contract["nodeId"], contract["attemptId"]
    expected = contract["expectedOutput"] or DEFAULT_EXPECTED_OUTPUT
    return (
        f"{authored.rstrip()}\n\n---\n"
        f"Workflow step contract (workflow: {contract['workflowName']}, step: {node_id}, "
        f"attempt: {attempt_id})\n\n"
        "Complete this step by calling the `workflow` tool exactly once with:\n"
        f'{{"action":"submit","step":"{node_id}","attempt":"{attempt_id}",'
        '"output":<your result>}\n'
        f"Expected output: {expected}\n"
        "The step is complete only after the workflow tool accepts the output.\n"
        "If the tool reports a validation error, correct the output and call it again."
    )
