"""Which run a session holds (reference 6.13, 6.14): one unfinished run per session, and a
finished run leaves the session view once its result has been presented."""

from __future__ import annotations

import time

import pytest

from pi_workflows.client.session_client import SessionClient
from tests.host.conftest import HostHarness


def _start(harness: HostHarness, workflow: str, session: str, *, check: bool = True):
    return harness.cli(
        "run",
        "start",
        workflow,
        "--session",
        session,
        "--project",
        str(harness.project),
        "--no-autostart",
        check=check,
    )


@pytest.mark.scenario("6.14")
def test_a_session_holds_one_unfinished_run(harness: HostHarness):
    harness.start_host()
    first = _start(harness, "echo", "session-one").stdout.strip()
    harness.wait_for_status(first, "waiting")

    refused = _start(harness, "hello", "session-one", check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"Error: This session already has an unfinished workflow run ({first}); "
        "wait for it to finish or cancel it before starting another."
    )
    # Other sessions and headless runs are not held back.
    elsewhere = _start(harness, "hello", "session-two").stdout.strip()
    assert harness.wait_for_status(elsewhere, "completed")
    assert harness.wait_for_status(harness.start_run("hello"), "completed")

    harness.cli("run", "cancel", first)
    second = _start(harness, "hello", "session-one").stdout.strip()
    assert harness.wait_for_status(second, "completed")["status"] == "completed"


@pytest.mark.scenario("6.13", "8.4")
def test_a_finished_run_leaves_the_view_after_its_result_was_presented(harness: HostHarness):
    harness.start_host(PI_WORKFLOWS_TERMINAL_VIEW_MS="500")
    run_id = _start(harness, "hello", "session-view").stdout.strip()
    harness.wait_for_status(run_id, "completed")
    session = SessionClient(harness.home, "session-view", autostart=False)
    try:
        # Finished, but its terminal message is still to be shown: the view keeps it.
        view = session.open()
        assert view["run"]["runId"] == run_id
        session.report_branch()
        terminal = session.deliver_next()
        assert terminal["kind"] == "terminal"
        assert session.view["run"]["runId"] == run_id  # sent, no turn yet
        turn = session.respond(terminal)
        assert turn["end"]["receipt"]["ownership"] == "settled"
        ended_at = time.time()
        session.wait_for(lambda v: v["run"] is None, what="the finished run to leave the view")
        assert time.time() - ended_at >= 0.4
    finally:
        session.close()
