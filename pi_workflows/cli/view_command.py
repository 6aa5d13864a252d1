"""`pi-workflows view [RUN] [--web [--port N]]`: the full-screen viewer (runs list, run
view) in the terminal, or served to a browser."""

from __future__ import annotations

import click

from .context import CliContext, pass_cli


@click.command("view")
@click.argument("run_id", required=False)
@click.option("--web", is_flag=True, help="Serve the viewer to a browser on 127.0.0.1.")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="With --web: the port (default: a free one).",
)
@pass_cli
def view_command(cli_ctx: CliContext, run_id: str | None, web: bool, port: int | None) -> None:
    """Follow runs live: the runs list, or RUN_ID's graph, steps and panes; answer, pause,
    resume, cancel and settle effects from it (keys in the footer; q goes back). With
    --web, print a URL (with a token) that serves the same app to a browser."""
    if port is not None and not web:
        raise click.UsageError("--port goes with --web.")
    client = cli_ctx.client()
    client.host_status()  # connect first: a missing host is a one-line error, not a TUI
    if run_id is not None:
        client.known_run_status(run_id)
    if web:
        from ..view.web import serve

        cli_ctx.close()  # each browser session connects on its own
        serve(cli_ctx.home, cli_ctx.database_url, run_id, port)
        return
    from ..view.app import ViewerApp  # Textual loads only for this command

    ViewerApp(client, run_id).run()
