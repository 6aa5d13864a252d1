"""`pi-workflows state status|verify|backup|copy`."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import HostAlreadyRunningError
from ..host.lock import live_lock_holder
from ..storage.maintenance import state_backup, state_status, state_verify, upgrade_needed
from ..storage.state_copy import copy_state
from .context import CliContext, emit_json, json_option, pass_cli


@click.group("state")
def state_group() -> None:
    """Inspect, check and back up the state database."""


@state_group.command("status")
@json_option
@pass_cli
def status_command(cli_ctx: CliContext, as_json: bool) -> None:
    """Show the schema and counts of runs, queue rows and blobs (read-only)."""
    status = state_status(cli_ctx.store(read_only=True))
    if as_json:
        emit_json(status)
        return
    click.echo(f"database: {status['database']} at {status['location']}")
    click.echo(f"schema: {status['schemaName']} v{status['schemaVersion']}")
    if status["upgradeNeeded"]:
        click.echo(upgrade_needed(status["schemaVersion"]))
    runs = ", ".join(f"{k} {v}" for k, v in sorted(status["runs"].items())) or "none"
    click.echo(f"runs: {runs}")
    click.echo(f"pending decisions: {status['pendingDecisions']}")
    click.echo(f"blobs: {status['blobs']}")


@state_group.command("verify")
@json_option
@pass_cli
def verify_command(cli_ctx: CliContext, as_json: bool) -> None:
    """Check integrity, foreign keys, blob addresses and run revisions (read-only); exit 1
    on problems."""
    problems = state_verify(cli_ctx.store(read_only=True))
    if as_json:
        emit_json({"ok": not problems, "problems": problems})
    elif problems:
        for problem in problems:
            click.echo(problem, err=True)
    else:
        click.echo("state ok")
    if problems:
        raise SystemExit(1)


@state_group.command("backup")
@click.argument("destination", type=click.Path(dir_okay=False, path_type=Path))
@json_option
@pass_cli
def backup_command(cli_ctx: CliContext, destination: Path, as_json: bool) -> None:
    """Copy the SQLite database to DESTINATION (safe while a host is running)."""
    result = state_backup(cli_ctx.store(read_only=True), destination)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"backed up {result['bytes']} bytes to {result['destination']}")


@state_group.command("copy")
@click.option(
    "--to",
    "target_url",
    required=True,
    help="The new, empty database, e.g. postgresql://USER@HOST/DB.",
)
@json_option
@pass_cli
def copy_command(cli_ctx: CliContext, target_url: str, as_json: bool) -> None:
    """Copy this home's state into a new, empty database (stop the host first)."""
    holder = live_lock_holder(cli_ctx.home.lock_path)
    if holder is not None:
        raise HostAlreadyRunningError(
            f"A workflow host (PID {holder['pid']}) is writing this state; stop it with "
            "'pi-workflows host stop' and copy again."
        )
    result = copy_state(cli_ctx.store(), target_url)
    if as_json:
        emit_json(result)
        return
    total = sum(result["rows"].values())
    click.echo(f"copied {total} rows in {len(result['rows'])} tables to {result['target']}")
