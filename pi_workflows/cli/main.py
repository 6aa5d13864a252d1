"""The `pi-workflows` entry point: the root group, global options and error handling."""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import __version__, plugins
from ..errors import PiWorkflowsError
from ..home import HOME_ENV
from .checkpoint_commands import checkpoint_group
from .context import CliContext, database_url_from
from .decision_commands import decision_group
from .effects_commands import effects_group
from .host_commands import host_group
from .plugins_command import plugins_command
from .run_commands import run_group
from .session_commands import session_group
from .state_commands import state_group
from .workflows_command import workflows_command


class PiWorkflowsGroup(click.Group):
    """Turns the project's errors into one-line messages with exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PiWorkflowsError as error:
            raise click.ClickException(str(error)) from error


@click.group(cls=PiWorkflowsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pi-workflows")
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    default=None,
    help=f"State directory (default: the platform data dir; env {HOME_ENV}).",
)
@click.option(
    "--database",
    default=None,
    help="SQLite path or postgresql:// URL (env PI_WORKFLOWS_DATABASE).",
)
@click.option(
    "--no-autostart",
    is_flag=True,
    help="Fail instead of starting a host when none is running.",
)
@click.pass_context
def cli(ctx: click.Context, home: str | None, database: str | None, no_autostart: bool) -> None:
    """pi-workflows: a durable host for multi-step agent workflows."""
    state = CliContext(home, database_url_from(database), autostart=not no_autostart)
    ctx.obj = state
    ctx.call_on_close(state.close)


cli.add_command(host_group)
cli.add_command(run_group)
cli.add_command(plugins_command)
cli.add_command(state_group)
cli.add_command(workflows_command)
cli.add_command(checkpoint_group)
cli.add_command(decision_group)
cli.add_command(effects_group)
cli.add_command(session_group)


def main(argv: list[str] | None = None) -> None:
    for failure in plugins.register_commands(cli):
        print(f"pi-workflows: warning: {failure}", file=sys.stderr)
    cli.main(args=argv, prog_name="pi-workflows")
