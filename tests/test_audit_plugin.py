"""The pip-installed third-party plugin `plugins/pi-workflows-audit`, end to end."""

from __future__ import annotations

import json

from pi_workflows.storage import record_run_change


def _two_runs(store, make_run) -> None:
    with store.transaction():
        make_run("audit-a", workflow_name="hello")
        make_run("audit-b", workflow_name="shell")
    with store.transaction():
        record_run_change("audit-a", event_type="run.started", actor="host", status="running")
    with store.transaction():
        record_run_change(
            "audit-a",
            event_type="run.completed",
            actor="worker",
            payload={"output": "hi"},
            status="completed",
        )
    store.close()


def test_the_installed_plugin_is_listed_with_its_distribution(home_env, audit_plugin):
    result = home_env.run_cli("plugins", "--json")

    assert result.returncode == 0, result.stderr
    entry = next(e for e in json.loads(result.stdout) if e["name"] == audit_plugin)
    assert entry == {
        "name": "audit",
        "kind": "entrypoint",
        "distribution": "pi-workflows-audit",
        "version": "0.1.0",
        "hooks": ["piw_register_commands"],
    }
    text = home_env.run_cli("plugins")
    assert "audit  (pi-workflows-audit 0.1.0)" in text.stdout


def test_audit_events_shows_one_run_history_in_revision_order(
    home_env, audit_plugin, store, make_run
):
    _two_runs(store, make_run)

    result = home_env.run_cli("audit", "events", "audit-a", "--json")

    assert result.returncode == 0, result.stderr
    events = json.loads(result.stdout)
    assert [(e["revision"], e["type"], e["actor"]) for e in events] == [
        (1, "run.created", "test"),
        (2, "run.started", "host"),
        (3, "run.completed", "worker"),
    ]
    assert events[2]["payload"] == {"output": "hi"}
    assert all(e["runId"] == "audit-a" and e["recordedAt"] > 0 for e in events)


def test_audit_events_text_and_all_runs(home_env, audit_plugin, store, make_run):
    _two_runs(store, make_run)

    result = home_env.run_cli("audit", "events")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    assert lines[0].endswith("audit-a  r1  run.created  by test")
    assert lines[-1].endswith("audit-a  r3  run.completed  by worker")
    assert lines[0][:4].isdigit() and "T" in lines[0].split()[0]


def test_audit_events_for_an_unknown_run_fails_with_exit_1(home_env, audit_plugin):
    result = home_env.run_cli("audit", "events", "no-such-run")

    assert result.returncode == 1
    assert result.stderr == (
        "Error: Workflow run no-such-run does not exist; see 'pi-workflows run list'.\n"
    )


def test_audit_summary_counts_runs_events_and_blobs(home_env, audit_plugin, store, make_run):
    _two_runs(store, make_run)

    result = home_env.run_cli("audit", "summary", "--json")

    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["runs"] == {"completed": 1, "queued": 1}
    assert summary["events"] == 4
    assert summary["eventsByType"] == {"run.created": 2, "run.started": 1, "run.completed": 1}
    assert summary["blobs"] > 0
    text = home_env.run_cli("audit", "summary")
    assert "runs: completed 1, queued 1" in text.stdout and "events: 4" in text.stdout


def test_audit_honours_the_global_database_option(home_env, audit_plugin, tmp_path):
    other = tmp_path / "other.sqlite"

    result = home_env.run_cli("--database", str(other), "audit", "summary", "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"runs": {}, "events": 0, "eventsByType": {}, "blobs": 0}
    assert other.exists() and not home_env.home.database_path.exists()
