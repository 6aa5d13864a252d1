"""An agent step's validator: raise to reject, return the value to keep, None to keep the
submission (issue 22.5). Real host, real worker, the headless `command` executor and a
session turn through the CLI."""

from __future__ import annotations

import json
import shlex
import sys

from .conftest import HostHarness

# The validator only raises; on good output it returns None, as a plain check does.
CHECKED = """
from pi_workflows import agent, compute, edge, workflow


def has_findings(output, ctx):
    if not isinstance(output, dict) or not isinstance(output.get("findings"), list):
        raise ValueError("output.findings must be a list")


def normalised(output, ctx):
    return {"count": len(output["findings"])}


WORKFLOW = workflow(
    name="checked",
    start_at="inspect",
    nodes={
        "inspect": agent("Inspect the project.", validate=has_findings),
        "count": agent("Count them.", validate=normalised),
        "finish": compute(lambda ctx: {"found": ctx.outputs["inspect"], **ctx.outputs["count"]}),
    },
    edges=[edge("inspect", "count"), edge("count", "finish")],
)
"""

AGENT = """
import sys
sys.stdin.read()
print('Here you are: {"findings": ["README.md", "setup.py"]}')
"""


def test_a_headless_step_keeps_its_output_when_the_validator_returns_none(
    harness: HostHarness, tmp_path
):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    harness.write_workflow("checked", CHECKED)
    harness.start_host(
        PI_WORKFLOWS_AGENT_COMMAND=f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    )
    run_id = harness.start_run("checked", args=["--headless"])
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {"found": {"findings": ["README.md", "setup.py"]}, "count": 2}


def test_a_session_submission_is_kept_when_the_validator_returns_none(harness: HostHarness):
    harness.write_workflow("checked", CHECKED)
    harness.start_host()
    run_id = harness.start_run("checked", session="s-1")

    def respond(output: object) -> tuple[int, dict]:
        done = harness.cli(
            "session", "respond", "s-1", "--output-json", json.dumps(output), check=False
        )
        return done.returncode, json.loads(done.stdout)

    code, refused = respond({"findings": "README.md"})
    assert code == 1 and refused["submission"]["outcome"] == "rejected"
    assert "findings must be a list" in refused["submission"]["error"]
    code, accepted = respond({"findings": ["README.md"]})
    assert code == 0, accepted
    code, counted = respond({"findings": ["a", "b", "c"]})
    assert code == 0, counted

    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {"found": {"findings": ["README.md"]}, "count": 3}
