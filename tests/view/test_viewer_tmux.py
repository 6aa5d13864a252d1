"""`pi-workflows view RUN` in a real terminal (tmux) at 80×24, with the keys a person would
press: a run of the `branch` example followed live while its decision step runs, scrubbed,
and its checkpoint answered; and a run with two agent steps followed live through both."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from pi_workflows.testing.host import WorkflowHost
from tests.polling import wait_until
from tests.tmux import Tmux

from .test_real_run import hold, start_held_continue_lane, use_scripted_agent

pytestmark = pytest.mark.integration


def _view(workflow_host: WorkflowHost, tmux: Tmux, run_id: str) -> None:
    env = {**workflow_host.env, "TERM": "tmux-256color"}
    command = shlex.join(
        [
            "env",
            "-i",
            *(f"{k}={v}" for k, v in env.items()),
            sys.executable,
            "-m",
            "pi_workflows",
            "view",
            run_id,
        ]
    )
    tmux.start(command, str(workflow_host.project), size=(80, 24))


def _shows(tmux: Tmux, text: str, what: str) -> None:
    wait_until(lambda: text in tmux.screen(), timeout=60, what=what)


def test_a_branch_run_is_followed_live_scrubbed_and_answered_in_tmux(workflow_host, tmux: Tmux):
    use_scripted_agent(workflow_host, {"classify": {"route": "checkpoint", "reason": "which?"}})
    classify = hold(workflow_host, "classify")
    workflow_host.start()
    run_id = workflow_host.start_run("branch", {"task": "Tidy up the README."})
    _view(workflow_host, tmux, run_id)

    _shows(tmux, "◐ classify", "the decision step running in the view")
    assert "· checkpoint_lane" in tmux.screen()
    classify.unlink()  # the step ends while the view is open: it follows the run
    _shows(tmux, "⏸ checkpoint_lane", "the run at its checkpoint")
    screen = tmux.screen()
    assert "✓ classify" in screen and "steps (live)" in screen
    assert "┏━ checkpoint ━▶ checkpoint_lane" in screen or "┣━ checkpoint ━▶" in screen
    tmux.keys("Left")  # as it was after the decision: its lane not taken yet
    _shows(tmux, "steps (step 1 of 2)", "the scrubbed graph")
    assert "├─ checkpoint ─▶ checkpoint_lane" in tmux.screen()
    tmux.keys("End")
    tmux.keys("a")
    _shows(tmux, "checkpoint: which?", "the answer dialog")
    tmux.type(json.dumps({"readme": "the top-level one"}))

    _shows(tmux, "completed", "the continuation")
    client = workflow_host.client()
    try:
        status = client.known_run_status(run_id)
    finally:
        client.close()
    assert status["continuation"]["status"] == "completed"
    tmux.keys("q")


def test_a_run_with_two_agent_steps_is_followed_live_through_both_in_tmux(
    workflow_host, tmux: Tmux
):
    run_id, classify, lane = start_held_continue_lane(workflow_host)
    _view(workflow_host, tmux, run_id)

    _shows(tmux, "◐ classify", "the first agent step running")
    classify.unlink()
    _shows(tmux, "◐ continue_lane", "the second agent step running")
    assert "✓ classify" in tmux.screen()
    lane.unlink()
    _shows(tmux, "✓ continue_lane", "the second agent step done")
    _shows(tmux, "completed", "the run completed")
    tmux.keys("Left")
    _shows(tmux, "steps (step 1 of 2)", "the replay after the first step")
    assert "· continue_lane" in tmux.screen()
    assert workflow_host.wait_for_run(run_id)["status"] == "completed"
    tmux.keys("q")
