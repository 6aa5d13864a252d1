"""A single SQLite host stalled past its lease carries on (issue 30, item 5, SQLite half).

The host is SIGSTOPped for real (a suspended laptop) for longer than its lease; when it
runs again it must take its lease again instead of exiting, and keep serving runs.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from pi_workflows.testing import installed_entry_points, short_temp_dir, wait_until
from tests.host.conftest import HostHarness
from tests.host.workflows import LOAD

pytestmark = pytest.mark.integration

HOST_LEASE_MS = 1500


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    harness = HostHarness(short_temp_dir(), entry_points=installed_entry_points())
    harness.env["PI_WORKFLOWS_HOST_LEASE_MS"] = str(HOST_LEASE_MS)
    harness.env["PI_WORKFLOWS_HEARTBEAT_S"] = "0.3"
    harness.write_workflow("load", LOAD)
    try:
        yield harness
    finally:
        if harness.host_process is not None and harness.host_process.poll() is None:
            harness.host_process.send_signal(signal.SIGCONT)
        harness.cleanup()


def test_a_sqlite_host_stalled_past_its_lease_takes_it_again_and_serves_on(harness):
    process = harness.start_host()
    epoch = harness.status()["epoch"]

    process.send_signal(signal.SIGSTOP)
    # The stall lasts until the stored host lease has run out.
    wait_until(
        lambda: harness.query(
            "SELECT 1 FROM host_state WHERE epoch = ? AND expires_at < ?",
            epoch,
            int(time.time() * 1000),
        ),
        timeout=30,
        what="the stalled host's lease to run out",
    )
    process.send_signal(signal.SIGCONT)

    wait_until(
        lambda: "took the host lease again" in harness.host_log(),
        what="the host to take its lease again",
    )
    assert process.poll() is None, harness.host_log()
    assert harness.status()["epoch"] > epoch
    run_id = harness.start_run("load", {"n": 1})
    assert harness.wait_for_run(run_id)["status"] == "completed"
