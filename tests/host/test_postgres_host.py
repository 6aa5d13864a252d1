"""The host on a real PostgreSQL server: runs, claims and crash recovery work the same."""

from __future__ import annotations

import json
import os
import signal

from .conftest import HostHarness
from .workflows import STEPS


def test_a_host_on_postgresql_runs_workflows_and_recovers_a_killed_worker(
    harness: HostHarness, postgres_url: str
):
    harness.env["PI_WORKFLOWS_DATABASE"] = postgres_url
    harness.write_workflow("steps", STEPS)
    harness.start_host()
    status = json.loads(harness.cli("run", "start", "hello", "--wait", "--json").stdout)
    assert status["status"] == "completed"
    assert status["finalOutput"] == {"greeting": "Hello, world!"}

    run_id = harness.start_run("steps")
    first = harness.wait_for_pid("b.pid")
    os.kill(first, signal.SIGKILL)
    harness.wait_for_pid("b.pid", previous=first)
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {"sum": 3}
    assert (harness.project / "trace").read_text().split() == ["a", "b", "b", "c"]
    # Nothing was written to a SQLite file in the home: the state lives in PostgreSQL.
    assert not harness.home.database_path.exists()
    listed = json.loads(harness.cli("run", "list", "--json").stdout)
    assert {run["runId"] for run in listed} == {status["runId"], run_id}
