"""`pi-workflows state status|verify|backup|prune|copy`."""

from __future__ import annotations

import datetime
import math
import time
from pathlib import Path
from typing import Any

import click

from .. import settings
from ..clock import now_ms
from ..durations import duration_ms, parse_before
from ..errors import HostAlreadyRunningError, InvalidInputError
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
    space = status["space"]
    if "freeBytes" in space:
        click.echo(f"size: {space['bytes']} bytes, {space['freeBytes']} free")
    else:
        click.echo(
            f"size: {space['bytes']} bytes; {space['deadRows']} dead rows for autovacuum "
            f"beside {space['liveRows']} live"
        )


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


@state_group.command("prune")
@click.option("--before", "before_text", help="Prune what finished before this date or time.")
@click.option(
    "--older-than",
    "older_than",
    help="Prune what finished longer ago than this (30d, 12h; default: the retention setting).",
)
@click.option("--apply", is_flag=True, help="Delete; without it, only report what would go.")
@click.option(
    "--backup",
    "backup_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Back the SQLite database up to this new file first.",
)
@json_option
@pass_cli
def prune_command(
    cli_ctx: CliContext,
    before_text: str | None,
    older_than: str | None,
    apply: bool,
    backup_path: Path | None,
    as_json: bool,
) -> None:
    """Prune finished run lineages and the blobs only they used (a dry run without
    --apply); runs that are unfinished or still needed are kept. The host does it (started
    if none runs, unless --no-autostart), between serving its clients."""
    if before_text is not None and older_than is not None:
        raise InvalidInputError("Give --before or --older-than, not both.")
    if before_text is not None:
        before = parse_before(before_text)
    else:
        before = now_ms() - _age_ms(older_than)
    cutoff = datetime.datetime.fromtimestamp(before / 1000, datetime.UTC).isoformat()
    report = cli_ctx.client().prune_state(
        cutoff,
        apply=apply,
        backup_path=backup_path.resolve() if backup_path is not None else None,
        on_progress=None if as_json else _ProgressLine(),
    )
    if as_json:
        emit_json(report)
        return
    backup = report.get("backup")
    if backup is not None:
        click.echo(f"backed up {backup['bytes']} bytes to {backup['destination']}")
    click.echo(_counts(report))
    if not apply and report["runs"]:
        click.echo("run again with --apply to delete them")


def _counts(report: dict[str, Any]) -> str:
    verb = "pruned" if report["applied"] else "would prune"
    return (
        f"{verb} {report['runs']} runs in {report['lineages']} lineages: {report['events']} "
        f"events, {report['transcripts']} transcripts, {report['blobs']} blobs "
        f"({report['bytes']} bytes); {report['protectedLineages']} finished lineages kept "
        "because they are still needed"
    )


class _ProgressLine:
    """Shows on stderr how far the host's prune got: the first counts at once, then at
    most one line a second."""

    def __init__(self) -> None:
        self.shown_at = -math.inf

    def __call__(self, report: dict[str, Any]) -> None:
        if time.monotonic() - self.shown_at >= 1.0:
            self.shown_at = time.monotonic()
            click.echo(f"so far: {_counts(report)}", err=True)


def _age_ms(older_than: str | None) -> int:
    text = older_than if older_than is not None else settings.resolve().text("retention")
    try:
        age = duration_ms(text)
    except ValueError as error:
        raise InvalidInputError(f"--older-than must be {error}; got {text!r}.") from None
    if age == 0:
        raise InvalidInputError("The retention is 0 (keep everything); give --older-than.")
    return age


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
