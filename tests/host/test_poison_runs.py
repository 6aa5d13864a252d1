"""Poison runs: a node that kills its worker costs a bounded number of workers, then parks.

SPEC §7.4 item 4: only a committed node result or a lifecycle transition is progress, so
a worker that dies again where the last one died is not relaunched; `workerCrashLoop`
names a node that killed K workers in a row (`PI_WORKFLOWS_MAX_NODE_CRASHES`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from .conftest import HostHarness, wait_until

# `a` completes (real progress), then `boom` kills its own worker every time.
SUICIDAL = """
import os
import signal
from pathlib import Path

from pi_workflows import compute, edge, workflow


def boom(ctx):
    with open(Path.cwd() / "boom.count", "a") as handle:
        handle.write("x")
    os.kill(os.getpid(), signal.SIGKILL)


WORKFLOW = workflow(
    name="suicidal",
    start_at="a",
    nodes={"a": compute(lambda ctx: {"a": 1}), "boom": compute(boom)},
    edges=[edge("a", "boom")],
)
"""


def _settled(harness: HostHarness, run_id: str, code: str) -> dict:
    client = harness.client()
    try:
        return wait_until(
            lambda: (s := client.run_status(run_id))["errorCode"] == code and s,
            what=f"run {run_id} parked with {code}",
        )
    finally:
        client.close()


def _boom_count(harness: HostHarness) -> int:
    return len((harness.project / "boom.count").read_text())


@pytest.mark.scenario("A.2")
def test_a_node_that_kills_its_worker_is_relaunched_once_then_parked(harness: HostHarness):
    harness.write_workflow("suicidal", SUICIDAL)
    harness.start_host()
    run_id = harness.start_run("suicidal")
    status = _settled(harness, run_id, "workerNoProgress")
    assert status["queueStatus"] == "parked"
    assert "before it committed workflow progress" in status["statusDetail"]
    # One relaunch after the last progress (node a), and never another.
    assert _boom_count(harness) == 2
    assert [w[1] for w in harness.workers(run_id)] == ["crashed", "crashed"]
    waited = harness.cli("run", "start", "suicidal", "--wait", "--no-autostart", check=False)
    assert waited.returncode == 1  # a held run is not a success

    # `run resume` tries again; a third death at the same node is a crash loop.
    harness.cli("run", "resume", run_id)
    status = _settled(harness, run_id, "workerCrashLoop")
    assert "killed its worker 3 times in a row at node 'boom'" in status["statusDetail"]
    assert "pi-workflows run resume" in status["statusDetail"]
    assert _boom_count(harness) == 3 + 2  # the second run started above died twice too
    why = json.loads(harness.cli("host", "status", "--json").stdout)
    assert why["blockedRuns"] == 2


@pytest.mark.integration
@pytest.mark.scenario("A.2")
def test_the_crash_limit_is_a_setting_and_survives_a_host_restart(harness: HostHarness):
    harness.write_workflow("suicidal", SUICIDAL)
    harness.start_host(PI_WORKFLOWS_MAX_NODE_CRASHES="2")
    run_id = harness.start_run("suicidal")
    status = _settled(harness, run_id, "workerCrashLoop")
    assert "2 times in a row at node 'boom'" in status["statusDetail"]
    assert _boom_count(harness) == 2
    harness.stop()
    harness.start_host(PI_WORKFLOWS_MAX_NODE_CRASHES="2")
    # The new host knows the run is held (the queue row says so, not host memory).
    host = json.loads(harness.cli("host", "status", "--json").stdout)
    assert host["blockedRuns"] == 1
    # A run started now is claimed by the same claim passes that would take the held one.
    harness.wait_for_status(harness.start_run("hello"), "completed")
    assert _boom_count(harness) == 2  # the held run was never relaunched
    assert len(harness.workers(run_id)) == 2


# A manual action that records its worker's pid and blocks: killing the worker leaves the
# effect `applying` (it may or may not have happened).
MANUAL_ACTION = """
import os
import time
from pathlib import Path

from pi_workflows import action, manual_effect, workflow


def send(ctx):
    (Path.cwd() / "send.pid").write_text(str(os.getpid()))
    time.sleep(120)
    return {"sent": True}


WORKFLOW = workflow(
    name="manual",
    start_at="send",
    nodes={"send": action(send, manual_effect("email"))},
    edges=[],
)
"""


@pytest.mark.scenario("3.12")
def test_host_status_counts_an_effect_a_dead_worker_left_uncertain(harness: HostHarness):
    harness.write_workflow("manual", MANUAL_ACTION)
    harness.start_host()
    waiting = subprocess.Popen(
        [sys.executable, "-m", "pi_workflows", "run", "start", "manual", "--wait", "--json"],
        env=harness.env,
        cwd=harness.project,
        stdout=subprocess.PIPE,
        text=True,
    )
    os.kill(harness.wait_for_pid("send.pid"), signal.SIGKILL)
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 1  # waiting on an ambiguous effect is not a success
    status = json.loads(out)
    assert (status["status"], status["errorCode"]) == ("waiting", "effectAmbiguous")
    host = json.loads(harness.cli("host", "status", "--json").stdout)
    assert host["ambiguousEffects"] == 1
    assert host["blockedRuns"] == 1


# One node that asks for 2 GiB at once (calloc: no page is touched, so without a limit it
# costs nothing).
MEMORY_HOG = """
from pi_workflows import compute, workflow


def hog(ctx):
    return {"bytes": len(bytearray(2 << 30))}


WORKFLOW = workflow(name="hog", start_at="hog", nodes={"hog": compute(hog)}, edges=[])
"""


@pytest.mark.integration
def test_a_node_past_the_worker_memory_limit_fails_naming_the_limit(harness: HostHarness):
    harness.write_workflow("hog", MEMORY_HOG)
    harness.start_host(PI_WORKFLOWS_WORKER_MEMORY="1G")
    assert harness.wait_for_run(harness.start_run("hello", {"name": "x"}))["status"] == "completed"
    run_id = harness.start_run("hog")
    assert harness.wait_for_run(run_id)["status"] == "failed"
    why = json.loads(harness.cli("run", "why", run_id, "--json").stdout)
    assert "MemoryError" in why["reason"]
    assert "PI_WORKFLOWS_WORKER_MEMORY, 1024 MiB" in why["reason"], why
