"""Which plugins an environment installs, told apart without importing any of them.

Kept apart from `pi_workflows.plugins` (pluggy, the hook specifications) so that a
command that only talks to the host can compare its plugin set with the host's cheaply:
the distributions on `sys.path` are read directly (their `entry_points.txt`, and the
`Name`/`Version` headers of the few that declare a plugin), which costs about a
millisecond where `importlib.metadata` costs some 25 ms of every process that loads
plugins (a host, each worker fork server, most commands), so `plugins` loads the entry
points found here too.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Iterator
from typing import NamedTuple

from . import __version__
from .builtin import ESSENTIAL_PLUGINS

ENTRY_POINT_GROUP = "pi_workflows"
PLUGINS_ENV = "PI_WORKFLOWS_PLUGINS"
DISABLE_ENV = "PI_WORKFLOWS_DISABLE_PLUGINS"
DISTRIBUTION_SUFFIXES = (".dist-info", ".egg-info")


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
    for entry_point in plugin_entry_points():
        if entry_point.name not in disabled:
            entries.append(
                f"entrypoint {entry_point.name} {entry_point.distribution} {entry_point.version}"
            )
    entries.extend(f"env {name}" for name in names_from_env(PLUGINS_ENV) if name not in disabled)
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:16]


class PluginEntryPoint(NamedTuple):
    """One `pi_workflows` entry point of an installed distribution."""

    name: str
    value: str  # what it names: "module" or "module:attribute"
    distribution: str | None
    version: str | None


def plugin_entry_points() -> Iterator[PluginEntryPoint]:
    """Every `pi_workflows` entry point of the distributions on `sys.path`; of two
    distributions with one name, the first on the path counts, as in
    `importlib.metadata.entry_points`."""
    seen: set[str] = set()
    for directory in sys.path:
        directory = directory or "."
        try:
            children = os.listdir(directory)
        except OSError:  # missing, not a directory, or a zip archive
            continue
        for child in children:
            stem, suffix = os.path.splitext(child)
            if suffix.lower() not in DISTRIBUTION_SUFFIXES:
                continue
            key = _normalized(stem.partition("-")[0])
            if key in seen:
                continue
            seen.add(key)
            path = os.path.join(directory, child)
            found = _group_entry_points(_read(os.path.join(path, "entry_points.txt")))
            if found:
                distribution, version = _name_and_version(path, suffix.lower())
                for name, value in found:
                    yield PluginEntryPoint(name, value, distribution, version)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError):  # none (or an egg-info file, not a directory)
        return ""


def _group_entry_points(text: str) -> list[tuple[str, str]]:
    """(name, value) of each entry point of the `[pi_workflows]` section of an
    entry_points.txt; a value's extras (`module:attr [extra]`) are left out."""
    found: list[tuple[str, str]] = []
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == ENTRY_POINT_GROUP and "=" in line:
            name, _, value = line.partition("=")
            found.append((name.strip(), value.partition("[")[0].strip()))
    return found


def _name_and_version(path: str, suffix: str) -> tuple[str | None, str | None]:
    """The `Name` and `Version` headers of a distribution's metadata."""
    metadata = "METADATA" if suffix == ".dist-info" else "PKG-INFO"
    headers: dict[str, str] = {}
    for line in _read(os.path.join(path, metadata)).splitlines():
        if not line:  # the headers end at the first empty line
            break
        key, separator, value = line.partition(":")
        if separator and key in ("Name", "Version") and key not in headers:
            headers[key] = value.strip()
    return headers.get("Name"), headers.get("Version")
