"""Plugins the host refuses rather than half-obeys (issue 22.10): a wrapper of a hook the
core calls one implementation at a time, an in-memory state database, a state database
in a directory other users can write to. Real host, real CLI, real plugin modules."""

from __future__ import annotations

import json
import os

import pytest

from pi_workflows.testing import short_temp_dir

from .conftest import HostHarness

# `piw_run_transition` is called one implementation at a time: a wrapper would never run.
WRAPS_A_NOTIFICATION = """
from pi_workflows import hookimpl


@hookimpl(hookwrapper=True)
def piw_run_transition(run_id, old_status, new_status, detail):
    yield
"""

# `piw_worker_run_command` goes through pluggy whole: wrapping it works.
WRAPS_A_DECISION = """
import os
from pathlib import Path

from pi_workflows import hookimpl


@hookimpl(wrapper=True)
def piw_worker_run_command(record, resume_interaction_attempt_id):
    command = yield
    Path(os.environ["WRAPPED_MARKER"]).write_text(record.run_id)
    return command
"""

IN_MEMORY_STORAGE = """
import peewee

from pi_workflows import hookimpl


@hookimpl(tryfirst=True)
def piw_open_database(url, home):
    return peewee.SqliteDatabase(":memory:")
"""


# integration: the refusal is read from the host process's own log, written while it loads
# its plugins (an in-process host loads them in the test process).
@pytest.mark.integration
@pytest.mark.sqlite_only
def test_a_wrapper_of_a_one_at_a_time_hook_is_refused_at_load(harness: HostHarness):
    marker = harness.root / "wrapped"
    harness.add_plugin("wraps_a_notification", WRAPS_A_NOTIFICATION)
    harness.add_plugin("wraps_a_decision", WRAPS_A_DECISION)
    harness.env["WRAPPED_MARKER"] = str(marker)

    listed = harness.run_cli("plugins", "--json")
    plugins = {entry["name"]: entry for entry in json.loads(listed.stdout)}
    refused = plugins["wraps_a_notification"]
    assert refused["kind"] == "broken"
    assert "\n" not in refused["error"]
    assert "Plugin 'wraps_a_notification'" in refused["error"]
    assert (
        "it wraps piw_run_transition, which pi-workflows calls one implementation"
        in (refused["error"])
    )
    assert plugins["wraps_a_decision"]["kind"] == "env"
    warnings = [line for line in listed.stderr.splitlines() if "wraps_a_notification" in line]
    assert len(warnings) == 1, listed.stderr

    # The host runs without the refused plugin, and with the wrapper it may have.
    harness.start_host()
    run_id = harness.start_run("hello", {"name": "Ada"})
    assert harness.wait_for_status(run_id, "completed")["finalOutput"]
    assert marker.read_text() == run_id
    assert "it wraps piw_run_transition" in harness.host_log()


@pytest.mark.sqlite_only
def test_an_in_memory_state_database_is_refused_and_leaves_no_file(harness: HostHarness):
    harness.add_plugin("in_memory_storage", IN_MEMORY_STORAGE)
    before = sorted(os.listdir(harness.project))

    for command in (("state", "status"), ("host", "run")):
        result = harness.run_cli(*command)
        assert result.returncode == 1, result
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith("Error: The storage plugin opened an in-memory SQLite database")
        assert "return a SqliteDatabase with a file path" in error
    assert sorted(os.listdir(harness.project)) == before  # no file named ':memory:'
    assert not harness.home.socket_path.exists()


@pytest.mark.sqlite_only
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770], ids=["777", "1777", "770"])
def test_a_state_database_in_a_directory_others_can_write_is_refused(
    harness: HostHarness, mode: int
):
    shared = short_temp_dir()
    try:
        os.chmod(shared, mode)
        database = str(shared / "state.sqlite")
        for command in (("state", "status"), ("host", "run")):
            result = harness.run_cli("--database", database, *command)
            assert result.returncode == 1, result
            assert result.stderr.count("\n") == 1, result.stderr
            assert f"directory {shared} is writable by other users (mode {mode:o})" in (
                result.stderr
            )
        assert os.listdir(shared) == []
    finally:
        os.chmod(shared, 0o700)
        shared.rmdir()
