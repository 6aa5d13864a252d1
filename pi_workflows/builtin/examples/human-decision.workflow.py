"""human-decision: propose something, let an operator continue, stop or replan it."""

from pi_workflows import choice, compute, edge, human_decision, switch, text_input, workflow


def proposal(ctx):
    goal = (ctx.input or {}).get("goal") or "ship the release"
    return {"goal": goal, "steps": ["run the tests", "tag the release", "publish"]}


def approval_request(ctx):
    plan = ctx.outputs["proposal"]
    return {
        "title": f"Approve the plan to {plan['goal']}?",
        "subject": plan,
        "presentation": {
            "summary": f"A plan with {len(plan['steps'])} steps is ready.",
            "blocks": [
                {"type": "section", "text": "Proposed steps"},
                {"type": "bullets", "items": plan["steps"]},
            ],
        },
    }


WORKFLOW = workflow(
    name="human-decision",
    start_at="proposal",
    nodes={
        "proposal": compute(proposal),
        "approve": human_decision(
            audience="operator",
            choices={
                "continue": choice("Continue"),
                "stop": choice("Stop"),
                "replan": choice("Replan", input=text_input("instructions", "What should change?")),
            },
            request=approval_request,
            on_timeout={"after_ms": 60 * 60 * 1000, "response": {"choice": "stop"}},
        ),
        "continued": compute(lambda ctx: {"decision": ctx.outputs["approve"]}),
        "stopped": compute(lambda ctx: {"decision": ctx.outputs["approve"]}),
        "replan": compute(lambda ctx: {"decision": ctx.outputs["approve"]}),
    },
    edges=[
        edge("proposal", "approve"),
        switch(
            "approve",
            on="$.choice",
            cases={"continue": "continued", "stop": "stopped", "replan": "replan"},
        ),
    ],
)
