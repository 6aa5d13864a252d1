"""Entry point of the `pi` plugin: the hooks it implements are added here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pi_workflows.plugin import hookimpl

from .executor import pi_executor

if TYPE_CHECKING:
    import click


@hookimpl
def piw_register_commands(cli: click.Group) -> None:
    # Imported on use: hosts and workers load this plugin too, and only the command line
    # needs the commands (and click).
    from .commands import pi_group

    cli.add_command(pi_group)


@hookimpl
def piw_register_agent_executors(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """The headless agent executor `pi` (PI_WORKFLOWS_AGENT_EXECUTOR=pi)."""
    register("pi", pi_executor)
