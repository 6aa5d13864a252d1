# A terse layout that keeps the built-in safety wording.
from pi_workflows.plugin import GUARDRAILS, PREAMBLE, MessageContent, canonical_json, hookimpl


@hookimpl
def piw_render_terminal_message(facts, instructions):
    heading = f"{facts['workflowName']} {facts['status']} (run {facts['runId']})"
    result = canonical_json(facts["finalOutput"] if facts["error"] is None else facts["error"])
    lines = [PREAMBLE, instructions, *GUARDRAILS, "", heading, result]
    return MessageContent(text="\n".join(lines), details={"format": "terse"})
