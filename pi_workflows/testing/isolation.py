"""Keeping a test's plugins its own: installed entry points stay out unless asked for.

Isolation goes through the switch every user has, ``PI_WORKFLOWS_DISABLE_PLUGINS``: the
names of installed entry-point plugins the test did not ask for are disabled, in this
process and in every host or CLI process the test starts, so a test means the same thing
on a laptop with ten plugins installed and on a bare CI machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pluggy

from .. import plugins
from ..home import CONFIG_ENV, DATABASE_ENV, HOME_ENV
from ..plugin_set import plugin_entry_points

# Variables that would point a test's processes at someone else's state or plugins.
FOREIGN_ENV = (HOME_ENV, CONFIG_ENV, DATABASE_ENV, plugins.PLUGINS_ENV, plugins.DISABLE_ENV)


def installed_entry_points() -> list[str]:
    """Names of the plugins installed under the ``pi_workflows`` entry point group."""
    return sorted({entry_point.name for entry_point in plugin_entry_points()})


def isolating_env(entry_points: Iterable[str] = (), modules: Iterable[str] = ()) -> dict[str, str]:
    """The plugin variables that load built-ins, `entry_points` and `modules` only."""
    wanted, installed = set(entry_points), installed_entry_points()
    unknown = wanted - set(installed)
    if unknown:
        raise ValueError(
            f"No installed pi_workflows entry point named {', '.join(sorted(unknown))}; "
            "pip-install the distribution that provides it."
        )
    env = {plugins.DISABLE_ENV: ",".join(n for n in installed if n not in wanted)}
    module_list = ",".join(modules)
    if module_list:
        env[plugins.PLUGINS_ENV] = module_list
    return env


def clean_environ() -> dict[str, str]:
    """This process's environment without any ``PI_WORKFLOWS_*`` variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PI_WORKFLOWS_")}


class IsolatedPlugins:
    """The process-wide plugin manager, loaded with the built-ins (and what a test asks for).

    ``register(plugin)`` adds a plugin object (a class instance or a module) until the test
    ends; hooks are then called through the façade in :mod:`pi_workflows.plugins`, exactly
    as the host calls them.
    """

    def __init__(self) -> None:
        self._registered: list[str] = []

    @property
    def manager(self) -> pluggy.PluginManager:
        return plugins.registry().manager

    @property
    def hooks(self) -> ModuleType:
        """The façade the host calls hooks through: ``hooks.render_terminal_message(...)``."""
        return plugins

    def register(self, plugin: Any, name: str | None = None) -> str:
        """Register `plugin` for the rest of the test; returns its name.

        A name isolation blocked (an installed entry point's) is unblocked for the test.
        """
        if name is not None and self.manager.is_blocked(name):
            self.manager.unblock(name)
        registered = self.manager.register(plugin, name=name)
        if registered is None:
            raise ValueError(f"Plugin {name or plugin!r} is blocked or already registered.")
        self._registered.append(registered)
        return registered

    def names(self) -> list[str]:
        """Names of every plugin currently registered."""
        return [name for name, plugin in self.manager.list_name_plugin() if plugin is not None]

    def unregister_all(self) -> None:
        for name in reversed(self._registered):
            if self.manager.has_plugin(name):
                self.manager.unregister(name=name)
        self._registered.clear()


@contextmanager
def isolated_plugins(
    entry_points: Iterable[str] = (), modules: Iterable[str] = ()
) -> Iterator[IsolatedPlugins]:
    """Reload the process-wide plugins isolated for a block; restore them afterwards."""
    saved = {name: os.environ.get(name) for name in (plugins.DISABLE_ENV, plugins.PLUGINS_ENV)}
    os.environ.pop(plugins.PLUGINS_ENV, None)
    os.environ.update(isolating_env(entry_points, modules))
    plugins.reload()
    isolated = IsolatedPlugins()
    try:
        yield isolated
    finally:
        isolated.unregister_all()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        plugins.reload()
