"""two-turn: three agent steps that build on each other, bundled by a compute step."""

from pi_workflows import agent, compute, edge, workflow

WORKFLOW = workflow(
    name="two-turn",
    start_at="inspect",
    nodes={
        "inspect": agent(
            "Read at least two files of this project and report what you found.",
            expected_output='{"findings": ["..."], "repoSummary": "..."}',
            status_detail="reading the project",
        ),
        "draft": agent(
            lambda ctx: (
                "Using your findings, draft a short improvement plan.\n\n"
                f"Findings: {ctx.outputs['inspect']}"
            ),
            expected_output='{"draft": "..."}',
            status_detail="drafting a plan",
        ),
        "checklist": agent(
            "Turn the draft into a checklist with references to the files involved.",
            expected_output='{"checklist": ["..."], "references": ["..."]}',
            status_detail="writing the checklist",
        ),
        "finalize": compute(
            lambda ctx: {key: ctx.outputs[key] for key in ("inspect", "draft", "checklist")}
        ),
    },
    edges=[edge("inspect", "draft"), edge("draft", "checklist"), edge("checklist", "finalize")],
)
