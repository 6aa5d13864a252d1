"""The `pi-workflows` command line as users run it: a real console script in a subprocess."""

from __future__ import annotations

import json
import sqlite3

import click
import pytest
from click.testing import CliRunner

from pi_workflows import __version__, plugins
from pi_workflows.cli.main import cli
from pi_workflows.storage import SCHEMA_VERSION, open_state, put_json


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()):
    # The root group loads built-in commands on demand: ask it, not its dict.
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _command_paths(command, (*prefix, name))


def test_version_option_prints_the_package_version(home_env):
    result = home_env.run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"pi-workflows, version {__version__}"


def test_the_module_entry_point_runs_the_same_cli(home_env):
    result = home_env.run_cli("--help", module=True)
    assert result.returncode == 0
    assert "Usage: pi-workflows" in result.stdout
    for name in ("plugins", "state"):
        assert name in result.stdout


def test_every_command_has_help(audit_plugin):
    failures = plugins.register_commands(cli)
    assert failures == []
    runner = CliRunner()
    paths = [((), cli)] + list(_command_paths(cli))
    assert len(paths) > 5
    for path, command in paths:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output
        first_line = command.help.split("\n")[0].split() if command.help else []
        assert first_line and " ".join(first_line) in " ".join(result.output.split()), path


def test_a_usage_error_exits_with_status_2(home_env):
    unknown = home_env.run_cli("no-such-command")
    missing_argument = home_env.run_cli("state", "backup")
    bad_option = home_env.run_cli("state", "status", "--no-such-option")

    for result in (unknown, missing_argument, bad_option):
        assert result.returncode == 2, result.stderr
        assert "Usage:" in result.stderr
    assert "Missing argument 'DESTINATION'" in missing_argument.stderr


def test_state_status_reports_schema_and_counts(home_env, store, make_run):
    with store.transaction():
        make_run("status-a")
        make_run("status-b")

    result = home_env.run_cli("state", "status", "--json")

    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["database"] == "sqlite"
    assert status["location"] == str(home_env.home.database_path)
    assert status["runs"] == {"queued": 2} and status["queue"] == {"queued": 2}
    text = home_env.run_cli("state", "status")
    assert (
        "runs: queued 2" in text.stdout and f"pi-workflows-state v{SCHEMA_VERSION}" in text.stdout
    )


@pytest.mark.scenario("11.5")
def test_state_backup_produces_a_database_that_state_verify_accepts(
    home_env, store, make_run, tmp_path
):
    with store.transaction():
        make_run("backed-up")
    store.close()
    destination = tmp_path / "backups" / "state-copy.sqlite"
    destination.parent.mkdir()

    backup = home_env.run_cli("state", "backup", str(destination), "--json")

    assert backup.returncode == 0, backup.stderr
    assert json.loads(backup.stdout)["destination"] == str(destination)
    assert oct(destination.stat().st_mode & 0o777) == oct(0o600)
    verified = home_env.run_cli("--database", str(destination), "state", "verify", "--json")
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout) == {"ok": True, "problems": []}
    with sqlite3.connect(destination) as connection:
        assert connection.execute("SELECT run_id FROM runs").fetchall() == [("backed-up",)]
    connection.close()


@pytest.mark.scenario("11.5")
def test_state_backup_refuses_to_overwrite(home_env, tmp_path):
    open_state(home_env.home).close()
    destination = tmp_path / "exists.sqlite"
    destination.write_text("keep me")

    result = home_env.run_cli("state", "backup", str(destination))

    assert result.returncode == 1
    assert "exists" in result.stderr
    assert destination.read_text() == "keep me"


def test_state_verify_exits_1_on_a_corrupted_blob(home_env):
    store = open_state(home_env.home)
    try:
        with store.transaction():
            blob_hash = put_json({"kept": "value"})
        store.db.execute_sql("UPDATE blobs SET content = ? WHERE blob_hash = ?", (b"{}", blob_hash))
    finally:
        store.close()

    result = home_env.run_cli("state", "verify")

    assert result.returncode == 1
    assert f"blob {blob_hash[:12]}: content does not match its address" in result.stderr
    as_json = home_env.run_cli("state", "verify", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["ok"] is False


def test_state_verify_reports_a_missing_event(home_env, store, make_run):
    with store.transaction():
        make_run("gap-run")
    store.db.execute_sql("DELETE FROM events WHERE run_id = 'gap-run'")
    store.close()

    result = home_env.run_cli("state", "verify")

    assert result.returncode == 1
    assert "run gap-run: revision 1 but 0 events" in result.stderr


def test_database_env_variable_selects_the_database(home_env, tmp_path):
    target = tmp_path / "from-env.sqlite"
    env = {"PI_WORKFLOWS_DATABASE": str(target)}

    empty = home_env.run_cli("state", "status", "--json", env=env)
    assert empty.returncode == 1
    assert empty.stderr == (
        f"Error: {target} holds no pi-workflows state yet; the first host creates it "
        "('pi-workflows host start', or any 'run start').\n"
    )
    assert not target.exists()  # a read-only look creates nothing
    open_state(home_env.home, str(target)).close()

    result = home_env.run_cli("state", "status", "--json", env=env)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["location"] == str(target)
    assert not home_env.home.database_path.exists()


def test_an_unsupported_database_url_is_a_one_line_error(home_env):
    result = home_env.run_cli("--database", "mysql://db.example/x", "state", "status")

    assert result.returncode == 1
    assert result.stderr == (
        "Error: Unsupported database URL scheme 'mysql'; use a SQLite path, sqlite:///PATH "
        "or postgresql://USER@HOST/DB.\n"
    )
