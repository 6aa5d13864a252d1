"""A plugin hook that hangs in a launch, a turn report or a terminal message does not
freeze the host (issue 30, item 6).

Each plugin really blocks: once `<gate>/hang` exists, its hook waits until the test
creates `<gate>/release` (at teardown at the latest). The host, a real process, waits for
the hook at most the hook deadline, names the plugin in one log line and in `host
status`, and goes on without it (the built-in answers) or fails that one operation;
meanwhile it serves other clients, and once the stuck call returns it asks the plugin
again.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.builtin.terminal import DEFAULT_INSTRUCTIONS
from pi_workflows.testing import installed_entry_points, short_temp_dir, wait_until
from tests.host.conftest import HostHarness
from tests.host.workflows import LOAD
from tests.sessions.conftest import TWO_STEPS, Sessions

pytestmark = pytest.mark.integration

DEADLINE_MS = 500
PLUGIN = "hanging_hook"

HANG = """
import os
import time
from pathlib import Path

from pi_workflows import hookimpl

GATE = Path(os.environ["HANG_GATE"])


def hang():
    (GATE / "hanging").touch()
    while not (GATE / "release").exists():
        time.sleep(0.05)
    (GATE / "returned").touch()
"""


def _plugin(hook: str, signature: str, body: str = "") -> str:
    """A plugin whose `hook` hangs while the gate says so, then defers (returns None)."""
    return (
        HANG
        + f"""

@hookimpl
def {hook}({signature}):
{body or "    pass"}
    if (GATE / "hang").exists():
        hang()
    return None
"""
    )


@pytest.fixture
def gate() -> Iterator[Path]:
    path = short_temp_dir()
    (path / "hang").touch()
    try:
        yield path
    finally:
        (path / "release").touch()  # the plugin's thread ends with the test
        shutil.rmtree(path, ignore_errors=True)  # its host ended with the test's harness


def _harness(gate: Path, source: str, database_url: str | None = None) -> HostHarness:
    harness = HostHarness(short_temp_dir(), database_url, entry_points=installed_entry_points())
    harness.env["PI_WORKFLOWS_HOOK_TIMEOUT_MS"] = str(DEADLINE_MS)
    harness.env["HANG_GATE"] = str(gate)
    harness.add_plugin(PLUGIN, source)
    harness.write_workflow("load", LOAD)
    return harness


def _timed_out_lines(harness: HostHarness, hook: str) -> list[str]:
    sentence = f"Plugin {PLUGIN!r} did not answer hook {hook} within {DEADLINE_MS} ms"
    return [line for line in harness.host_log().splitlines() if sentence in line]


def _hung_then_released(harness: HostHarness, gate: Path, hook: str) -> None:
    """The plugin was named once, is shown hung, and is asked again once it returns."""
    assert len(_timed_out_lines(harness, hook)) == 1, harness.host_log()
    (hung,) = harness.status()["hungPlugins"]
    assert f"{PLUGIN!r} did not answer hook {hook}" in hung
    assert "plugin hung: " in harness.cli("host", "status").stdout
    (gate / "release").touch()
    wait_until(
        lambda: "returned from its hung hook call" in harness.host_log(),
        what="the host to hear the plugin return",
    )
    assert harness.status()["hungPlugins"] == []


@pytest.mark.parametrize(
    ("hook", "signature"),
    [
        ("piw_worker_process", "envelope, settings"),
        ("piw_worker_run_command", "record, resume_interaction_attempt_id"),
    ],
)
def test_a_hanging_launch_hook_costs_one_deadline_and_the_built_in_launches(gate, hook, signature):
    harness = _harness(gate, _plugin(hook, signature))
    try:
        harness.start_host()
        first = harness.start_run("load", {"n": 1})
        assert harness.wait_for_run(first)["status"] == "completed"
        assert (gate / "hanging").exists() and not (gate / "returned").exists()
        # Left out while its call hangs: the next launch does not wait for it again.
        second = harness.start_run("load", {"n": 2})
        assert harness.wait_for_run(second)["status"] == "completed"
        assert not (gate / "returned").exists()
        # `run why` of a run in progress names the hung plugin too.
        held = harness.start_run("load", {"n": 3, "hold": True})
        harness.wait_for_status(held, "running")
        why = harness.cli("run", "why", held).stdout
        assert f"plugin hung: Plugin {PLUGIN!r} did not answer hook {hook}" in why, why
        (harness.project / "go").touch()
        assert harness.wait_for_run(held)["status"] == "completed"
        _hung_then_released(harness, gate, hook)
    finally:
        harness.cleanup()


@pytest.mark.parametrize(
    ("hook", "signature"),
    [
        ("piw_presentation_instructions", "run, facts"),
        ("piw_render_terminal_message", "facts, instructions"),
    ],
)
def test_a_hanging_presentation_hook_still_gets_the_session_its_terminal_message(
    gate, hook, signature
):
    harness = _harness(gate, _plugin(hook, signature))
    try:
        harness.start_host()
        run_id = harness.start_run("load", {"n": 3}, session="session-waiting")
        message = harness.wait_for_message("session-waiting", run_id)
        # The built-ins wrote it: their instruction line, the run's facts.
        assert DEFAULT_INSTRUCTIONS in message["content"].split("\n")
        assert message["details"]["terminal"]["status"] == "completed"
        assert not (gate / "returned").exists()
        _hung_then_released(harness, gate, hook)
    finally:
        harness.cleanup()


# Opens the reported turn (a write through ctx), then hangs: the report must not keep it.
WRITES_THEN_HANGS = """
    if report.target_session_id != "session-hung" or report.state != "started":
        return None
    ctx.start_turn(report)
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
def test_a_hanging_turn_adjudication_fails_that_report_alone(gate, database_url):
    source = _plugin("piw_adjudicate_turn_report", "report, ctx", WRITES_THEN_HANGS)
    harness = _harness(gate, source, database_url)
    harness.write_workflow("two-steps", TWO_STEPS)
    sessions = Sessions(harness)
    try:
        harness.start_host()
        sessions.start("two-steps", "session-hung")
        hung = sessions.open("session-hung")
        hung.report_branch()
        message, turn = hung.deliver_next(), hung.new_turn_id()

        refused = hung.report_turn(message, turn, "started")
        assert refused.outcome == "rejected"
        assert f"{PLUGIN!r} did not answer hook piw_adjudicate_turn_report" in refused.error
        # What the plugin wrote before it hung was rolled back with the report.
        assert harness.query("SELECT 1 FROM workflow_turns WHERE workflow_turn_id = ?", turn) == []

        # The host serves on while the plugin is still stuck: the same report again, and
        # another session's, are adjudicated by the built-in.
        again = hung.report_turn(message, turn, "started")
        assert (again.outcome, again.receipt["ownership"]) == ("accepted", "active")
        sessions.start("two-steps", "session-other")
        other = sessions.open("session-other")
        other.report_branch()
        started = other.report_turn(other.deliver_next(), other.new_turn_id(), "started")
        assert (started.outcome, started.receipt["ownership"]) == ("accepted", "active")
        assert not (gate / "returned").exists()
        _hung_then_released(harness, gate, "piw_adjudicate_turn_report")
    finally:
        sessions.close()
        harness.cleanup()
