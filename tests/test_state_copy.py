"""`state copy --to postgresql://…`: a SQLite home's history moves into PostgreSQL intact."""

from __future__ import annotations

import json

from pi_workflows.storage import open_state
from tests.host.conftest import HostHarness, harness  # noqa: F401  (the fixture)


def _cli_json(harness: HostHarness, *args: str) -> dict:  # noqa: F811
    return json.loads(harness.cli(*args, "--json").stdout)


def test_state_copy_moves_a_sqlite_home_into_an_empty_postgres_database(
    harness: HostHarness,  # noqa: F811
    postgres_url: str,
):
    harness.start_host()
    finished = [_cli_json(harness, "run", "start", "hello", "--wait") for _ in range(2)]
    refused_while_running = harness.cli("state", "copy", "--to", postgres_url, check=False)
    assert refused_while_running.returncode == 1
    assert "host stop" in refused_while_running.stderr
    sqlite_epoch = _cli_json(harness, "host", "status")["epoch"]
    harness.stop()
    before = _cli_json(harness, "state", "status")

    copied = _cli_json(harness, "state", "copy", "--to", postgres_url)

    assert "@" not in copied["target"]  # no credentials in output
    assert copied["rows"]["runs"] == 2 and copied["rows"]["events"] > 2
    target = ("--database", postgres_url)
    assert _cli_json(harness, *target, "state", "verify") == {"ok": True, "problems": []}
    after = _cli_json(harness, *target, "state", "status")
    assert (after["runs"], after["queue"], after["blobs"]) == (
        before["runs"],
        before["queue"],
        before["blobs"],
    )
    # The same home now runs on PostgreSQL: its history is there and new runs work.
    harness.env["PI_WORKFLOWS_DATABASE"] = postgres_url
    harness.database_url = postgres_url
    harness.start_host()
    assert _cli_json(harness, "host", "status")["epoch"] == sqlite_epoch + 1
    listed = {
        run["runId"]: run["status"]
        for run in json.loads(harness.cli("run", "list", "--json").stdout)
    }
    assert {run["runId"]: "completed" for run in finished}.items() <= listed.items()
    assert _cli_json(harness, "run", "start", "hello", "--wait")["status"] == "completed"
    events = harness.query("SELECT COUNT(*) FROM events WHERE run_id = ?", finished[0]["runId"])
    assert events[0][0] >= 3


def test_state_copy_refuses_a_target_that_already_holds_state(
    harness: HostHarness,  # noqa: F811
    postgres_url: str,
):
    target = ("--database", postgres_url)
    harness.env["PI_WORKFLOWS_DATABASE"] = postgres_url
    harness.start_host()
    _cli_json(harness, "run", "start", "hello", "--wait")
    harness.stop()
    del harness.env["PI_WORKFLOWS_DATABASE"]
    open_state(harness.home).close()  # an (empty) SQLite home to copy from

    refused = harness.cli("state", "copy", "--to", postgres_url, check=False)

    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert (
        "already holds pi-workflows state" in refused.stderr and "empty database" in refused.stderr
    )
    assert _cli_json(harness, *target, "state", "status")["runs"] == {"completed": 1}
