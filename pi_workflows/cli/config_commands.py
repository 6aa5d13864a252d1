"""`pi-workflows config list|get|set|unset`: the settings file, `<config>/settings.toml`."""

from __future__ import annotations

import os
from typing import Any

import click

from .. import settings
from ..host.lock import live_lock_holder
from .context import CliContext, emit_json, json_option, pass_cli


@click.group("config")
def config_group() -> None:
    """Settings that stick: agent executor, Pi model, workers, leases, timers.

    They live in <config>/settings.toml (PI_WORKFLOWS_CONFIG_DIR, default the platform
    config dir); a PI_WORKFLOWS_<KEY> variable overrides a setting for the processes that
    have it. A host reads them when it starts: `pi-workflows host restart` applies a change.
    """


def _entry(item: settings.Resolved) -> dict[str, Any]:
    return {
        "key": item.setting.key,
        "env": item.setting.env,
        "value": item.setting.shown(item.value),
        "source": item.source,
        "default": item.setting.default,
        "description": item.setting.description,
    }


def _resolved(key: str) -> settings.Resolved:
    item = settings.setting(key)
    path = settings.settings_path()
    return settings.resolve_one(item, os.environ, settings.read_file(path), path)


def _after_change(cli_ctx: CliContext, item: settings.Setting) -> None:
    """Say what still stands between the file and the processes that act on it."""
    if os.environ.get(item.env, "").strip():
        click.echo(f"note: {item.env} is set in this environment and overrides the file here.")
    if item.host_level and live_lock_holder(cli_ctx.home.lock_path) is not None:
        click.echo("the running host keeps its settings until `pi-workflows host restart`.")


@config_group.command("list")
@json_option
def list_command(as_json: bool) -> None:
    """Every setting: its value, where it comes from (env, file, default) and what it does."""
    path = settings.settings_path()
    table = settings.read_file(path)
    entries = [
        _entry(settings.resolve_one(item, os.environ, table, path)) for item in settings.SETTINGS
    ]
    if as_json:
        emit_json({"file": str(path), "settings": entries})
        return
    click.echo(f"settings file: {path}")
    for entry in entries:
        shown = "(not set)" if entry["value"] is None else entry["value"]
        click.echo(f"{entry['key']} = {shown}  [{entry['source']}]  {entry['description']}")


@config_group.command("get")
@click.argument("key")
@json_option
def get_command(key: str, as_json: bool) -> None:
    """Print one setting's effective value (nothing when it has none)."""
    item = _resolved(key)
    if as_json:
        emit_json({**_entry(item), "value": item.value})
    elif item.value is not None:
        click.echo(item.value)


# A value may start with a dash (`pi_args`, a negative number that is then refused).
@config_group.command("set", context_settings={"ignore_unknown_options": True})
@click.argument("key")
@click.argument("value")
@pass_cli
def set_command(cli_ctx: CliContext, key: str, value: str) -> None:
    """Set KEY to VALUE in the settings file (checked first; the file is replaced whole)."""
    item = settings.setting(key)
    checked = item.check(value, item.key)
    path = settings.settings_path()
    table = settings.read_file(path)
    table[item.key] = checked
    settings.write_file(table, path)
    click.echo(f"{item.key} = {item.shown(checked)} in {path}")
    _after_change(cli_ctx, item)


@config_group.command("unset")
@click.argument("key")
@pass_cli
def unset_command(cli_ctx: CliContext, key: str) -> None:
    """Remove KEY from the settings file: its default applies again."""
    path = settings.settings_path()
    table = settings.read_file(path, known_keys_only=False)
    if key in table and key not in settings.BY_KEY:  # a misspelt key: just drop it
        del table[key]
        settings.write_file(table, path)
        click.echo(f"{key} removed from {path}")
        return
    item = settings.setting(key)
    if table.pop(item.key, None) is None:
        click.echo(f"{item.key} is not in {path}")
        return
    settings.write_file(table, path)
    click.echo(f"{item.key} removed from {path} (default: {item.default})")
    _after_change(cli_ctx, item)
