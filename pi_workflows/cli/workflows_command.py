"""`pi-workflows workflows`: every workflow visible from a project, broken ones marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import discovery
from .context import emit_json, json_option


def _describe_source(source: dict[str, Any] | None) -> str:
    if source is None:
        return "unknown source"
    if source["kind"] == "file":
        return source["path"]
    owner = source.get("plugin", "builtin")
    return f"{owner}:{source['id']} (revision {source['revision'][:12]})"


@click.command("workflows")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True),
    default=".",
    help="Project directory whose .pi/workflows is searched (default: the current one).",
)
@json_option
def workflows_command(project: str, as_json: bool) -> None:
    """List workflows with their source, or BROKEN with the reason."""
    # Discovery runs workflow code, so it happens in a resolver subprocess.
    described = discovery.list_in_subprocess(Path(project))
    if as_json:
        emit_json(described)
        return
    for entry in described:
        if entry.get("error"):
            click.echo(f"{entry['name']}  BROKEN: {entry['error']}")
        else:
            click.echo(f"{entry['name']}  {_describe_source(entry['source'])}")
