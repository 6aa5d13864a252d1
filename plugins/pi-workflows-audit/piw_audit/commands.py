"""The `pi-workflows audit` command group, added by :mod:`piw_audit.plugin`.

Everything here reads state through `pi_workflows.storage`'s public functions, opened by the
CLI's shared context, so the plugin honours `--home` and `--database` like the core commands.
"""

from __future__ import annotations

import datetime

import click

from pi_workflows.plugin import (
    CliContext,
    NotFoundError,
    emit_json,
    event_counts,
    json_option,
    pass_cli,
    run_events,
    run_exists,
    state_status,
)


def _format_time(epoch_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@click.group("audit")
def audit_group() -> None:
    """Read-only audit views of the state store (pi-workflows-audit plugin)."""


@audit_group.command("events")
@click.argument("run_id", required=False)
@json_option
@pass_cli
def events_command(cli_ctx: CliContext, run_id: str | None, as_json: bool) -> None:
    """Show the immutable event history of RUN, or of every run when RUN is omitted."""
    cli_ctx.store()
    if run_id is not None and not run_exists(run_id):
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    events = run_events(run_id)
    if as_json:
        emit_json([event.to_json() for event in events])
        return
    for event in events:
        click.echo(
            f"{_format_time(event.recorded_at)}  {event.run_id}  r{event.revision}  "
            f"{event.event_type}  by {event.actor}"
        )


@audit_group.command("summary")
@json_option
@pass_cli
def summary_command(cli_ctx: CliContext, as_json: bool) -> None:
    """Count runs by status, events by type and stored blobs."""
    status = state_status(cli_ctx.store())
    counts = event_counts()
    summary = {
        "runs": status["runs"],
        "events": sum(counts.values()),
        "eventsByType": counts,
        "blobs": status["blobs"],
    }
    if as_json:
        emit_json(summary)
        return
    runs = ", ".join(f"{name} {count}" for name, count in sorted(summary["runs"].items()))
    click.echo(f"runs: {runs or 'none'}")
    click.echo(f"events: {summary['events']}")
    for event_type, count in sorted(counts.items()):
        click.echo(f"    {event_type}: {count}")
    click.echo(f"blobs: {summary['blobs']}")
