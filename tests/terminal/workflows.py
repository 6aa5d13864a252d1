"""Workflow sources and local plugins the terminal-message tests install."""

# One compute node that always fails.
FAILING = """
from pi_workflows import compute, workflow


def explode(ctx):
    raise RuntimeError("the widget exploded")


WORKFLOW = workflow(name="failing", start_at="only", nodes={"only": compute(explode)}, edges=[])
"""

# Fails with a different error on its first two runs, completes on the third: each run
# of a restart chain has its own terminal outcome. The count lives in <project>/attempts.
FLAKY = """
from pathlib import Path

from pi_workflows import compute, workflow

COUNTER = Path.cwd() / "attempts"


def attempt(ctx):
    number = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(number))
    if number < 3:
        raise RuntimeError(f"attempt {number} failed")
    return {"attempt": number}


WORKFLOW = workflow(
    name="flaky",
    start_at="only",
    nodes={"only": compute(attempt)},
    edges=[],
    presentation_prompt="Tell the user which attempt finally worked.",
)
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
