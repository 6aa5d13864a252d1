"""Workflow sources and local plugins the terminal-message tests install."""

# One compute node that always fails.
FAILING = """
from pi_workflows import compute, workflow


def explode(ctx):
    raise RuntimeError("the widget exploded")


WORKFLOW = workflow(name="failing", start_at="only", nodes={"only": compute(explode)}, edges=[])
"""

# Imports fine in the client, fails to import in a worker (which has a launch envelope).
LOAD_BROKEN = """
import os

from pi_workflows import compute, workflow

if "PI_WORKFLOWS_WORKER_LAUNCH" in os.environ:
    raise ImportError("a dependency of this workflow is missing")

WORKFLOW = workflow(
    name="broken", start_at="only", nodes={"only": compute(lambda ctx: 1)}, edges=[]
)
"""

# A rendering plugin (PI_WORKFLOWS_PLUGINS) that counts its calls in $RENDER_CALLS and
# misbehaves on the first one: RENDER_FAILURE=raise raises, =kill SIGKILLs the host
# right after the terminal state committed. Later calls defer to the built-in layout.
RENDER_FAULT_PLUGIN = """
import os
import signal
from pathlib import Path

from pi_workflows import hookimpl


@hookimpl
def piw_render_terminal_message(facts, instructions):
    counter = Path(os.environ["RENDER_CALLS"])
    calls = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(calls))
    if calls == 1 and os.environ["RENDER_FAILURE"] == "raise":
        raise RuntimeError("renderer is not ready yet")
    if calls == 1 and os.environ["RENDER_FAILURE"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return None
"""

# Completes with the number of its run in this project: every run of a restart chain has
# its own outcome (and so its own terminal fingerprint).
COUNTING = """
from pathlib import Path

from pi_workflows import compute, workflow

COUNTER = Path.cwd() / "count"


def count(ctx):
    number = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(number))
    return {"run": number}


WORKFLOW = workflow(name="counting", start_at="only", nodes={"only": compute(count)}, edges=[])
"""

# A checkpoint, then an attempt that fails twice and succeeds on the third try: a chain
# of continuations (answers) and restarts (after each failure).
GATED = """
from pathlib import Path

from pi_workflows import checkpoint, compute, edge, workflow

COUNTER = Path.cwd() / "attempts"


def attempt(ctx):
    number = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(number))
    if number < 3:
        raise RuntimeError(f"attempt {number} failed")
    return {"attempt": number, "answer": ctx.outputs["ask"]}


WORKFLOW = workflow(
    name="gated",
    start_at="ask",
    nodes={"ask": checkpoint(summary="Go ahead?"), "try": compute(attempt)},
    edges=[edge("ask", "try")],
)
"""

# A shell node with a manual effect that outlives its node timeout: the action is stopped
# midway, so its effect is left in doubt while the run ends (timed out).
STOPPED_PAYMENT = """
from pi_workflows import manual_effect, shell, workflow

WORKFLOW = workflow(
    name="stopped-payment",
    start_at="pay",
    nodes={
        "pay": shell(
            exec=lambda ctx: {"command": "sleep", "args": ["30"]},
            effect=manual_effect("payment"),
            timeout_ms=300,
        )
    },
    edges=[],
)
"""
