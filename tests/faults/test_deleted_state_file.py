"""The SQLite state file deleted under a running host (issue 30, item 3).

`rm state.sqlite*` for real while a real host runs: it must notice, refuse to write into
the unlinked file, say so in `host status`, its log and every answer, and the next host
must not start empty over a home that had state without saying so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pi_workflows.testing import installed_entry_points, short_temp_dir, wait_until
from tests.host.conftest import HostHarness
from tests.host.workflows import LOAD

pytestmark = pytest.mark.integration

GONE = "was deleted or replaced"


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    harness = HostHarness(short_temp_dir(), entry_points=installed_entry_points())
    harness.write_workflow("load", LOAD)
    try:
        yield harness
    finally:
        harness.cleanup()


def _status(harness: HostHarness) -> dict:
    return json.loads(harness.cli("host", "status", "--json").stdout)


def test_a_deleted_state_file_stops_the_writes_and_is_never_replaced_silently(harness):
    harness.start_host()
    done = harness.start_run("load", {"n": 1})
    assert harness.wait_for_run(done)["status"] == "completed"
    database = harness.home.database_path

    for path in database.parent.glob(database.name + "*"):
        path.unlink()

    status = wait_until(
        lambda: (s := _status(harness))["state"] == "databaseUnavailable" and s,
        what="host status to report the deleted file",
    )
    assert GONE in status["databaseUnavailable"]
    assert "DATABASE UNAVAILABLE" in harness.cli("host", "status").stdout
    started = harness.cli("run", "start", "load", "--input-json", '{"n": 2}', check=False)
    assert started.returncode == 1 and GONE in started.stderr
    assert not database.exists()  # nothing recreated it
    assert GONE in harness.host_log()

    assert "host stopped" in harness.cli("host", "stop").stdout
    again = harness.cli("host", "start", check=False)
    assert again.returncode == 1
    assert "is gone, but this home had one" in again.stderr
    assert not database.exists()
