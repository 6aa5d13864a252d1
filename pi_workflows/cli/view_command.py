"""`pi-workflows view [RUN]`: the full-screen viewer (runs list, run view) in the terminal."""

from __future__ import annotations

import click

from .context import CliContext, pass_cli


@click.command("view")
@click.argument("run_id", required=False)
@pass_cli
def view_command(cli_ctx: CliContext, run_id: str | None) -> None:
    """Follow runs live: the runs list, or RUN_ID's graph, steps and panes; answer, pause,
    resume, cancel and settle effects from it (keys in the footer; q goes back)."""
    from ..view.app import ViewerApp  # Textual loads only for this command

    client = cli_ctx.client()
    client.host_status()  # connect first: a missing host is a one-line error, not a TUI
    if run_id is not None:
        client.known_run_status(run_id)
    ViewerApp(client, run_id).run()
