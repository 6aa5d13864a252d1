# A terse layout that keeps the built-in safety wording.
from pi_workflows import hookimpl
from pi_workflows.builtin.terminal import GUARDRAILS, PREAMBLE
from pi_workflows.canonical import canonical_json
from pi_workflows.records import MessageContent


@hookimpl
def piw_render_terminal_message(facts, instructions):
    heading = f"{facts['workflowName']} {facts['status']} (run {facts['runId']})"
    result = canonical_json(facts["finalOutput"] if facts["error"] is None else facts["error"])
    lines = [PREAMBLE, instructions, *GUARDRAILS, "", heading, result]
    return MessageContent(text="\n".join(lines), details={"format": "terse"})
