"""`pi-workflows plugins`: what is registered, from where, implementing which hooks."""

from __future__ import annotations

import click

from .. import plugins
from .context import emit_json, json_option


@click.command("plugins")
@click.option(
    "--by-hook",
    is_flag=True,
    help="List hooks instead, each with its implementations in call order.",
)
@json_option
def plugins_command(by_hook: bool, as_json: bool) -> None:
    """List plugins (name, distribution, version, hooks), then who answers each hook first."""
    hooks = plugins.describe_hooks()
    if by_hook:
        if as_json:
            emit_json(hooks)
        else:
            _echo_hooks(hooks)
        return
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
    click.echo("")
    _echo_hooks(hooks)


def _echo_hooks(hooks: list[dict]) -> None:
    click.echo(
        "hooks, implementations in call order (a firstresult hook stops at the first answer):"
    )
    for hook in hooks:
        kind = "firstresult" if hook["firstresult"] else "every implementation"
        order = " -> ".join(hook["implementations"]) or "(no implementation)"
        click.echo(f"  {hook['hook']}  [{kind}]")
        click.echo(f"      {order}")
