"""`pi-workflows view RUN` in a real terminal (tmux): a run of the `branch` example (two
agent steps: the decision and, answered, its checkpoint lane) followed, scrubbed and its
checkpoint answered with the keys a person would press."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from tests.polling import wait_until
from tests.tmux import Tmux

from .test_real_run import use_scripted_agent

pytestmark = pytest.mark.integration


def test_a_branch_run_is_followed_scrubbed_and_answered_in_tmux(workflow_host, tmux: Tmux):
    use_scripted_agent(workflow_host, {"classify": {"route": "checkpoint", "reason": "which?"}})
    workflow_host.start()
    run_id = workflow_host.start_run("branch", {"task": "Tidy up the README."})
    workflow_host.wait_for_status(run_id, "waiting")
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

    wait_until(lambda: "⏸ checkpoint_lane" in tmux.screen(), timeout=60, what="the run view")
    screen = tmux.screen()
    assert "┏━ checkpoint ━▶ checkpoint_lane" in screen or "┣━ checkpoint ━▶" in screen
    assert "steps (live)" in screen
    tmux.keys("Left")  # as it was after the decision: its lane not taken yet
    wait_until(lambda: "steps (step 1 of 2)" in tmux.screen(), what="the scrubbed graph")
    assert "├─ checkpoint ─▶ checkpoint_lane" in tmux.screen()
    tmux.keys("End")
    tmux.keys("a")
    wait_until(lambda: "checkpoint: which?" in tmux.screen(), what="the answer dialog")
    tmux.type(json.dumps({"readme": "the top-level one"}))

    wait_until(lambda: "completed" in tmux.screen(), timeout=60, what="the continuation")
    client = workflow_host.client()
    try:
        status = client.known_run_status(run_id)
    finally:
        client.close()
    assert status["continuation"]["status"] == "completed"
    tmux.keys("q")
