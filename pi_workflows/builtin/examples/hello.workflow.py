"""hello: greet someone, without any agent. Input `{"name": ...}` (default "world")."""

from pi_workflows import compute, workflow


def greet(ctx):
    name = (ctx.input or {}).get("name") or "world"
    return {"greeting": f"Hello, {name}!"}


WORKFLOW = workflow(
    name="hello",
    start_at="greet",
    nodes={"greet": compute(greet, status_detail="greeting")},
    edges=[],
)
