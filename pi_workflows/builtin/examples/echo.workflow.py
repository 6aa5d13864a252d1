"""echo: one agent step that answers the task in `input.task`."""

from pi_workflows import agent, workflow


def reply_prompt(ctx):
    task = (ctx.input or {}).get("task") or "Summarize this repository in one sentence."
    return f"Task: {task}"


WORKFLOW = workflow(
    name="echo",
    start_at="reply",
    nodes={"reply": agent(reply_prompt, expected_output='{"reply": "..."}')},
    edges=[],
    presentation_prompt="Relay the reply to the user in your own words.",
)
