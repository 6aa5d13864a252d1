"""Which plugins an environment installs, told apart without importing any of them.

Kept apart from `pi_workflows.plugins` (pluggy, the hook specifications) so that a
command that only talks to the host can compare its plugin set with the host's cheaply.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os

from . import __version__
from .builtin import ESSENTIAL_PLUGINS

ENTRY_POINT_GROUP = "pi_workflows"
PLUGINS_ENV = "PI_WORKFLOWS_PLUGINS"
DISABLE_ENV = "PI_WORKFLOWS_DISABLE_PLUGINS"


def names_from_env(variable: str) -> list[str]:
    """The comma-separated module or plugin names of an environment variable."""
    return [name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()]


def plugin_set_digest() -> str:
    """A short digest of the plugin set this process's environment installs.

    Made from metadata and the plugin variables alone, without importing any plugin, so
    a command that only talks to the host pays nothing for it: this package's version
    (the built-ins), each entry point's name, distribution and version, the modules of
    `PI_WORKFLOWS_PLUGINS`, minus `PI_WORKFLOWS_DISABLE_PLUGINS`. The host sends its
    digest to every client, so a client can tell that a plugin was installed, removed,
    upgraded or configured differently since the host started.
    """
    disabled = set(names_from_env(DISABLE_ENV)) - set(ESSENTIAL_PLUGINS)
    entries = [f"builtin {__version__}", *(f"disabled {name}" for name in sorted(disabled))]
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name in disabled:
            continue
        dist = entry_point.dist
        name = dist.metadata["Name"] if dist else None
        entries.append(f"entrypoint {entry_point.name} {name} {dist.version if dist else None}")
    entries.extend(f"env {name}" for name in names_from_env(PLUGINS_ENV) if name not in disabled)
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:16]
