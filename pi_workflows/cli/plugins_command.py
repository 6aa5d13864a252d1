"""`pi-workflows plugins`: what is registered, from where, implementing which hooks."""

from __future__ import annotations

import click

from .. import plugins
from .context import emit_json, json_option


@click.command("plugins")
@json_option
def plugins_command(as_json: bool) -> None:
    """List plugins: name, distribution, version and implemented hooks."""
    described = plugins.describe_plugins()
    if as_json:
        emit_json(described)
        return
    for entry in described:
        if entry["kind"] == "broken":
            click.echo(f"{entry['name']}  BROKEN: {entry['error']}")
            continue
        origin = entry["distribution"] or entry["kind"]
        version = f" {entry['version']}" if entry["version"] else ""
        click.echo(f"{entry['name']}  ({origin}{version})")
        for hook in entry["hooks"]:
            click.echo(f"    {hook}")
