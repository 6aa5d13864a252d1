"""shell: run a command as a managed effect, then shape its output. Input `{"text": ...}`."""

from pi_workflows import compute, edge, idempotent_effect, shell, workflow


def echo_command(ctx):
    text = (ctx.input or {}).get("text") or "hello from a shell action"
    return {"command": "printf", "args": ["%s", text], "timeout_ms": 10_000}


WORKFLOW = workflow(
    name="shell",
    start_at="echo_text",
    nodes={
        "echo_text": shell(
            exec=echo_command,
            parse=lambda result, ctx: {
                "stdout": result["stdout"],
                "exitCode": result["exitCode"],
                "durationMs": result["durationMs"],
            },
            effect=idempotent_effect("echo"),
        ),
        "finalize": compute(lambda ctx: {"echoed": ctx.outputs["echo_text"]["stdout"]}),
    },
    edges=[edge("echo_text", "finalize")],
)
