# Ask for terse answers in every agent step; keep the built-in contract block.
from pi_workflows.plugin import default_step_prompt, hookimpl


@hookimpl
def piw_step_prompt(contract, authored):
    prompt = default_step_prompt(contract, authored)
    return f"Answer in at most three sentences.\n\n{prompt}"
