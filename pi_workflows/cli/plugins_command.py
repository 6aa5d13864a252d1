"""`pi-workflows plugins`: what is registered, from where, implementing which hooks."""

from __future__ import annotations

from pathlib import Path

import click

from .. import plugins
from .context import emit_json, json_option
from .plugin_template import write_distribution


@click.group("plugins", invoke_without_command=True)
@click.option(
    "--by-hook",
    is_flag=True,
    help="List hooks instead, each with its implementations in call order.",
)
@json_option
@click.pass_context
def plugins_command(ctx: click.Context, by_hook: bool, as_json: bool) -> None:
    """List plugins (name, distribution, version, hooks), then who answers each hook first."""
    if ctx.invoked_subcommand is not None:
        return
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


@plugins_command.command("new")
@click.argument("name")
@click.option(
    "--hook",
    "hooks",
    multiple=True,
    metavar="HOOK",
    help="A hook to implement (repeat for more); see 'pi-workflows plugins --by-hook'.",
)
@click.option(
    "--directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write it (default: ./pi-workflows-NAME; must not exist).",
)
def new_command(name: str, hooks: tuple[str, ...], directory: Path | None) -> None:
    """Write a ready plugin distribution NAME: pyproject with the entry point, documented
    stubs for each --hook, and a passing test written with the test kit."""
    target = directory or Path.cwd() / f"pi-workflows-{name}"
    written = write_distribution(name, list(hooks), target)
    click.echo(f"wrote {written}")
    click.echo(f"next: pip install -e '{written}[test]' && pytest -q {written}/tests")
