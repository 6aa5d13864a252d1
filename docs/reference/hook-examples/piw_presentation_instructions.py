# Ask for a one-line answer for failed runs of any workflow.
from pi_workflows.plugin import hookimpl


@hookimpl
def piw_presentation_instructions(run, facts):
    if facts["status"] != "completed":
        return "Say in one sentence what failed and what the user can do next."
    return None
