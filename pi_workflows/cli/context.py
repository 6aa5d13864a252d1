"""What every command shares: global options, the lazily opened store, output helpers."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ..storage import StateStore

from ..client import WorkflowClient
from ..errors import InvalidInputError
from ..home import DATABASE_ENV, Home, resolve_home


@dataclass
class CliContext:
    home_option: str | None
    database_url: str | None
    autostart: bool = True
    _home: Home | None = field(default=None, init=False)
    _store: StateStore | None = field(default=None, init=False)
    _client: WorkflowClient | None = field(default=None, init=False)

    @property
    def home(self) -> Home:
        if self._home is None:
            self._home = resolve_home(self.home_option)
        return self._home

    def store(self, *, read_only: bool = False) -> StateStore:
        """Open the state database on first use (commands that need no state never do);
        `read_only` for commands that only look: nothing is created, upgraded or written."""
        if self._store is None:
            from ..storage import open_state

            self._store = open_state(self.home, self.database_url, read_only=read_only)
        return self._store

    def client(self, *, autostart: bool | None = None) -> WorkflowClient:
        """The host client; the host is started on demand unless --no-autostart."""
        if self._client is None:
            allowed = self.autostart if autostart is None else autostart
            self._client = WorkflowClient(self.home, self.database_url, autostart=allowed)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._warn_if_plugins_differ(self._client)
            warn_if_settings_differ(self._client.hello)
            self._client.close()
            self._client = None
        if self._store is not None:
            self._store.close()

    def drop_client(self) -> None:
        """Close the client without the warnings about the host it talked to (stopped)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    @staticmethod
    def _warn_if_plugins_differ(client: WorkflowClient) -> None:
        """Say so when the host loaded other plugins than this command (installed since)."""
        hello = client.hello
        if hello is None or hello.get("pluginSet") is None:
            return
        from ..plugin_set import plugin_set_digest

        if hello["pluginSet"] == plugin_set_digest():
            return
        click.echo(
            "pi-workflows: warning: the running host loaded a different set of plugins than "
            "this command (a plugin was installed, removed or changed since it started); "
            "restart it: pi-workflows host stop && pi-workflows host start",
            err=True,
        )


def warn_if_settings_differ(hello: dict[str, Any] | None) -> None:
    """One line when this command asks (environment or settings file) for host-level
    settings the running host does not use: its workers act on the host's, not on ours."""
    if hello is None or not isinstance(hello.get("settings"), dict):
        return
    from ..settings import SettingError, differences

    try:
        different = differences(hello["settings"], os.environ)
    except SettingError:
        return  # a broken settings file is reported by the commands that read it
    if not different:
        return
    names = ", ".join(f"{item.key} ({item.env})" for item in different)
    click.echo(
        f"pi-workflows: warning: the running host uses other settings than this command asks "
        f"for: {names}; apply them with `pi-workflows host restart` (from this shell) or make "
        "them stick with `pi-workflows config set KEY VALUE`; `pi-workflows host status` shows "
        "what the host uses.",
        err=True,
    )


def database_url_from(option: str | None) -> str | None:
    return option or os.environ.get(DATABASE_ENV) or None


pass_cli = click.make_pass_decorator(CliContext)

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


class Seconds(click.ParamType):
    """A duration in seconds: a finite number, 0 or more (`--timeout -5`, `nan` or `inf`
    would wait forever or not at all without saying so)."""

    name = "seconds"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        option = param.opts[0] if param is not None and param.opts else "the duration"
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidInputError(
                f"{option} must be a number of seconds, 0 or more; got {str(value)[:40]!r}."
            )
        return seconds


SECONDS = Seconds()
