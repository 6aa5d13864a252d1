"""The `pi-workflows` entry point: the root group, global options and error handling."""

from __future__ import annotations

import importlib
import sys
from typing import Any, NoReturn

import click

from .. import __version__, forked_child
from ..errors import PiWorkflowsError
from ..home import HOME_ENV

# Built-in commands, imported only when invoked (or listed): `--version` or `run list`
# must not pay for the storage layer, the engine or plugin discovery.
BUILTIN_COMMANDS = {
    "host": "host_commands:host_group",
    "run": "run_commands:run_group",
    "plugins": "plugins_command:plugins_command",
    "state": "state_commands:state_group",
    "workflows": "workflows_command:workflows_command",
    "checkpoint": "checkpoint_commands:checkpoint_group",
    "decision": "decision_commands:decision_group",
    "effects": "effects_commands:effects_group",
    "session": "session_commands:session_group",
    "config": "config_commands:config_group",
    "view": "view_command:view_command",
}


class PiWorkflowsGroup(click.Group):
    """Turns the project's errors into one-line messages with exit status 1.

    Built-in commands load on first use; plugins are asked for their commands
    (`piw_register_commands`) only when a name is not built in, when commands are
    listed, or for `plugins` itself, which reports what plugins did.
    """

    _plugin_commands_loaded = False

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PiWorkflowsError as error:
            raise click.ClickException(str(error)) from error

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in BUILTIN_COMMANDS:
            module, attribute = BUILTIN_COMMANDS[cmd_name].split(":")
            imported = importlib.import_module(f"{__package__}.{module}")
            self.add_command(getattr(imported, attribute), cmd_name)
        if cmd_name not in BUILTIN_COMMANDS or cmd_name == "plugins":
            self.load_plugin_commands()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.load_plugin_commands()
        return sorted(set(self.commands) | set(BUILTIN_COMMANDS))

    def load_plugin_commands(self) -> None:
        if self._plugin_commands_loaded:
            return
        self._plugin_commands_loaded = True
        from .. import plugins

        for failure in plugins.register_commands(self):
            print(f"pi-workflows: warning: {failure}", file=sys.stderr)


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
    from .context import CliContext, database_url_from

    state = CliContext(home, database_url_from(database), autostart=not no_autostart)
    ctx.obj = state
    ctx.call_on_close(state.close)


def main(argv: list[str] | None = None) -> None:
    forked_child.command_entry = main  # a host this command starts is forked from it
    cli.main(args=argv, prog_name="pi-workflows")


def run() -> NoReturn:
    """The `pi-workflows` program: `main` on this process's arguments, ended as the
    interpreter ends a program but without tearing every module down, which cost a
    command 7-15 ms of its ~100 (`forked_child.exit_as_interpreter`)."""
    forked_child.exit_as_interpreter(main)
