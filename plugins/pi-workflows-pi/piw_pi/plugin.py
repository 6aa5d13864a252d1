"""Entry point of the `pi` plugin: the hooks it implements are added here."""

from __future__ import annotations

import click

from pi_workflows import hookimpl

from .commands import pi_group


@hookimpl
def piw_register_commands(cli: click.Group) -> None:
    cli.add_command(pi_group)
