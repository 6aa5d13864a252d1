# Ask for terse answers in every agent step; keep the built-in contract block.
from pi_workflows import hookimpl
from pi_workflows.builtin import step_prompt


@hookimpl
def piw_step_prompt(contract, authored):
    prompt = step_prompt.piw_step_prompt(contract, authored)
    return f"Answer in at most three sentences.\n\n{prompt}"
