"""The audit commands against real runs of a real host, written with the test kit."""

from __future__ import annotations

import json

import pytest

from pi_workflows.testing import WorkflowHome, WorkflowHost


def test_the_plugin_is_listed_only_where_it_is_enabled(workflow_home: WorkflowHome):
    isolated = json.loads(workflow_home.run_cli("plugins", "--json").stdout)
    workflow_home.use_entry_points("audit")
    enabled = json.loads(workflow_home.run_cli("plugins", "--json").stdout)

    assert "audit" not in {entry["name"] for entry in isolated}
    assert next(entry for entry in enabled if entry["name"] == "audit") == {
        "name": "audit",
        "kind": "entrypoint",
        "distribution": "pi-workflows-audit",
        "version": "0.1.0",
        "hooks": ["piw_register_commands"],
    }


@pytest.mark.scenario("11.12")
def test_events_and_summary_of_runs_a_host_executed(workflow_host: WorkflowHost):
    workflow_host.use_entry_points("audit")
    workflow_host.start()
    first = workflow_host.start_run("hello", {"name": "Ada"})
    second = workflow_host.start_run("hello", {"name": "Bo"})
    workflow_host.wait_for_status(first, "completed")
    workflow_host.wait_for_status(second, "completed")

    events = json.loads(workflow_host.cli("audit", "events", first, "--json").stdout)
    text = workflow_host.cli("audit", "events").stdout.splitlines()
    summary = json.loads(workflow_host.cli("audit", "summary", "--json").stdout)

    assert [event["revision"] for event in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "run.created" and events[-1]["type"] == "run.completed"
    assert {event["runId"] for event in events} == {first}
    assert len(text) == summary["events"] == 2 * len(events)
    assert text[0].split()[1:4] == [first, "r1", "run.created"]
    assert summary["runs"] == {"completed": 2}
    assert summary["eventsByType"]["run.completed"] == 2 and summary["blobs"] > 0


def test_an_unknown_run_fails_with_one_line(workflow_home: WorkflowHome):
    workflow_home.use_entry_points("audit")

    result = workflow_home.run_cli("audit", "events", "no-such-run")

    assert result.returncode == 1
    assert result.stderr == (
        "Error: Workflow run no-such-run does not exist; see 'pi-workflows run list'.\n"
    )


def test_the_global_database_option_is_honoured(workflow_home: WorkflowHome):
    workflow_home.use_entry_points("audit")
    other = workflow_home.root / "other.sqlite"

    result = workflow_home.run_cli("--database", str(other), "audit", "summary", "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"runs": {}, "events": 0, "eventsByType": {}, "blobs": 0}
    assert other.exists() and not workflow_home.home.database_path.exists()
