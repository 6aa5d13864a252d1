"""The graph fed from a real run: the built-in `branch` example through a real host, its
progress followed as `run watch` follows it, both ways the decision can go."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pi_workflows.client.run_follower import follow_run
from pi_workflows.discovery import find
from pi_workflows.testing.host import WorkflowHost
from pi_workflows.view.graph import WorkflowGraph, render_text
from pi_workflows.view.progress import entries_until_step, run_progress, watch_entries

# The headless agent: prints the reply written for the node it is asked to run, once the
# node's hold file (if the test made one) is gone.
AGENT = """\
import json, os, sys
from pi_workflows.testing.polling import wait_until
sys.stdin.read()
node = os.environ["PI_WORKFLOWS_NODE_ID"]
held = os.path.join({root!r}, "hold-" + node)
wait_until(lambda: not os.path.exists(held), timeout=120, what="the test to release " + node)
print(json.dumps(json.load(open({path!r}))[node]))
"""
# The `branch` example's continue lane: the decision step, then the lane's agent step.
CONTINUE_LANE = {
    "classify": {"route": "continue", "reason": "clear"},
    "continue_lane": {"summary": "tidied"},
}


def use_scripted_agent(host: WorkflowHost, replies: dict) -> None:
    """Agent steps answer with `replies[node id]` (set before the host starts); a step
    waits while `hold(host, node)` holds it."""
    (host.root / "replies.json").write_text(json.dumps(replies))
    (host.root / "agent.py").write_text(
        AGENT.format(root=str(host.root), path=str(host.root / "replies.json"))
    )
    host.env["PI_WORKFLOWS_AGENT_EXECUTOR"] = "command"
    host.env["PI_WORKFLOWS_AGENT_COMMAND"] = f"{sys.executable} {host.root / 'agent.py'}"


def hold(host: WorkflowHost, node: str) -> Path:
    """Hold the scripted agent's step `node` until the returned file is deleted."""
    path = host.root / f"hold-{node}"
    path.touch()
    return path


def start_held_continue_lane(host: WorkflowHost) -> tuple[str, Path, Path]:
    """Start the host and a `branch` run down its continue lane, both agent steps held:
    (the run id, the decision step's hold, the lane step's hold)."""
    use_scripted_agent(host, CONTINUE_LANE)
    classify, lane = hold(host, "classify"), hold(host, "continue_lane")
    host.start()
    return host.start_run("branch", {"task": "Tidy up the README."}), classify, lane


def _follow(host: WorkflowHost, replies: dict) -> tuple[list[dict], dict]:
    use_scripted_agent(host, replies)
    host.start()
    run_id = host.start_run("branch", {"task": "Tidy up the README."})
    payloads: list[dict] = []
    follow_run(host.home, run_id, payloads.append, autostart=False, timeout_s=60)
    # The whole run.status: a watch sends a compact one, without the status detail.
    client = host.client()
    try:
        return payloads, client.known_run_status(run_id)
    finally:
        client.close()


@pytest.fixture
def branch(workflow_host: WorkflowHost) -> WorkflowGraph:
    definition = find("branch", workflow_host.project)
    assert definition.definition is not None, definition.error
    return WorkflowGraph.from_snapshot(definition.definition.snapshot())


@pytest.mark.integration
def test_a_completed_branch_run_draws_the_lane_it_took(workflow_host, branch) -> None:
    payloads, status = _follow(workflow_host, CONTINUE_LANE)
    assert status["status"] == "completed"

    text = render_text(branch, run_progress(branch, watch_entries(payloads), status))

    assert text == (
        "✓ classify  decision\n"
        "┣━ continue ━▶ continue_lane\n"
        "└─ checkpoint ─▶ checkpoint_lane\n"
        "\n"
        "✓ continue_lane  agent\n"
        "· checkpoint_lane  checkpoint\n"
    )
    after_first = run_progress(branch, entries_until_step(watch_entries(payloads), 1))
    assert render_text(branch, after_first).splitlines()[:2] == [
        "✓ classify  decision",
        "├─ continue ─▶ continue_lane",
    ]


@pytest.mark.integration
def test_a_branch_run_at_its_checkpoint_draws_the_node_waiting(workflow_host, branch) -> None:
    payloads, status = _follow(
        workflow_host, {"classify": {"route": "checkpoint", "reason": "which README?"}}
    )
    assert status["status"] == "waiting"

    text = render_text(branch, run_progress(branch, watch_entries(payloads), status))

    assert "┗━ checkpoint ━▶ checkpoint_lane" in text
    assert text.splitlines()[-1] == "⏸ checkpoint_lane  checkpoint  which README?"
