"""Entry point of the `audit` plugin: the hooks it implements are added here.

Every pi-workflows process loads its plugins (a host, a worker's fork server, each
command), so this module imports only what a hook needs at once: the commands, click and
the state queries they use are imported when the command line asks for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pi_workflows.plugin import hookimpl

if TYPE_CHECKING:
    import click


@hookimpl
def piw_register_commands(cli: click.Group) -> None:
    from .commands import audit_group

    cli.add_command(audit_group)
