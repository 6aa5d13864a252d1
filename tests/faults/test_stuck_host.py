"""`host stop` and SIGTERM end a host within a bounded time, whatever state it is in
(issue 30, item 2).

The host's event loop is blocked for real by a plugin whose `piw_worker_process` never
returns (the host waits for it on the loop, right before it spawns a worker, for the hook
deadline, which this test sets to an hour), or the host is SIGSTOPped. Either way the
process must be gone within the bound, the lock given up, and `host stop` must tell the
truth about the lock's holder."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from pi_workflows.client.start_request import start_payload
from pi_workflows.host.lock import live_lock_holder
from pi_workflows.testing import installed_entry_points, short_temp_dir, wait_until
from tests.host.conftest import HostHarness
from tests.host.workflows import CHECKPOINTED

pytestmark = pytest.mark.integration

# While `<project>/hang` exists, the first worker launch blocks the host's event loop for
# good (the host waits for the worker's process spec on its loop, up to the deadline).
HANGING_PLUGIN = """
import time
from pathlib import Path

from pi_workflows import hookimpl


@hookimpl
def piw_worker_process(envelope, settings):
    if (Path.cwd() / "hang").exists():
        (Path.cwd() / "hanging").touch()
        while True:
            time.sleep(1)
"""
STOP_WAIT_S = 2  # the loop's own stop wait; the process ends 5 s after it at the latest
# + `host stop`'s 2 s for an answer before it signals, and the CLI's own start-up on a
# loaded machine.
BOUND_S = STOP_WAIT_S + 5 + 2 + 5


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    harness = HostHarness(short_temp_dir(), entry_points=installed_entry_points())
    harness.env["PI_WORKFLOWS_STOP_WAIT_S"] = str(STOP_WAIT_S)
    # A hook deadline longer than the test: the hung hook keeps the loop blocked.
    harness.env["PI_WORKFLOWS_HOOK_TIMEOUT_MS"] = str(3_600_000)
    harness.write_workflow("checkpointed", CHECKPOINTED)
    harness.add_plugin("hanging_launches", HANGING_PLUGIN)
    try:
        yield harness
    finally:
        harness.cleanup()


def _hang_the_loop(harness: HostHarness) -> None:
    (harness.project / "hang").touch()
    # The run's worker is launched before the host answers the start: send it, wait for no
    # answer.
    client = harness.client()
    try:
        client.connection.post("run.start", start_payload("checkpointed", harness.project, None))
        wait_until(lambda: (harness.project / "hanging").exists(), what="the host to hang")
    finally:
        client.close()


@pytest.mark.parametrize("how", ["host stop", "SIGTERM"])
def test_a_host_whose_event_loop_hangs_still_stops_and_gives_up_its_lock(harness, how):
    process = harness.start_host()
    _hang_the_loop(harness)

    began = time.monotonic()
    if how == "host stop":
        result = harness.cli("host", "stop", check=False)
        assert result.returncode == 0, result.stderr
        assert "host stopped" in result.stdout
    else:
        process.send_signal(signal.SIGTERM)
    process.wait(timeout=BOUND_S + 10)
    assert time.monotonic() - began < BOUND_S
    assert live_lock_holder(harness.home.lock_path) is None
    assert not harness.home.lock_path.exists()
    assert "did not finish stopping" in harness.host_log()

    # The home is free: the next host starts and runs the run the hung one had queued.
    (harness.project / "hang").unlink()
    harness.start_host()
    assert harness.status()["state"] == "running"


def test_host_stop_never_says_no_host_runs_while_one_holds_the_lock(harness):
    """A host that holds the lock but no longer answers on its socket is stopped by its
    PID, not reported as absent."""
    process = harness.start_host()
    process.send_signal(signal.SIGSTOP)  # holds the lock, answers nothing
    try:
        began = time.monotonic()
        result = harness.cli("host", "stop", check=False)
        # A stopped process cannot act on SIGTERM: the truth is its PID, not "no host",
        # told at once rather than after the bound of a stop (BOUND_S).
        assert time.monotonic() - began < BOUND_S / 2
        assert result.returncode == 1
        assert "no host is running" not in result.stdout
        assert f"PID {process.pid}" in result.stderr
        assert "is stopped" in result.stderr and f"kill -CONT {process.pid}" in result.stderr
    finally:
        process.send_signal(signal.SIGCONT)
    # Once it runs again the SIGTERM it was sent ends it.
    assert process.wait(timeout=BOUND_S) == 0
    assert live_lock_holder(harness.home.lock_path) is None
