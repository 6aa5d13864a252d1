"""branch: an agent decides whether to go on or to stop at a checkpoint for a human."""

from pi_workflows import agent, checkpoint, route, switch, workflow


def question(ctx):
    task = (ctx.input or {}).get("task") or "Tidy up the README."
    return f"Is this task clear enough to do now, or does it need clarification?\n\n{task}"


def presentation(context):
    if context.state["status"] == "waiting":
        return "Tell the user what needs clarifying and ask them to answer the checkpoint."
    return "Summarize what was done."


WORKFLOW = workflow(
    name="branch",
    start_at="classify",
    nodes={
        "classify": route(question, choices=["continue", "checkpoint"]),
        "continue_lane": agent(
            lambda ctx: f"Do the task.\n\n{(ctx.input or {}).get('task', '')}",
            expected_output='{"summary": "..."}',
        ),
        "checkpoint_lane": checkpoint(
            summary="needs clarification",
            run=lambda ctx: {
                "route": "checkpoint",
                "summary": ctx.outputs["classify"].get("reason", ""),
            },
        ),
    },
    edges=[
        switch(
            "classify",
            on="$.route",
            cases={"continue": "continue_lane", "checkpoint": "checkpoint_lane"},
        )
    ],
    presentation_prompt=presentation,
)
