"""The plugin's configuration file: `<config dir>/markdown-results.toml` (or `.json`).

```toml
[defaults]                 # every workflow (all keys optional)
prompt = "…"               # instructions for a completed run
failure_prompt = "…"       # instructions for a failed, timed-out or cancelled run
max_value_chars = 4000     # longer input/output/error values are cut

[workflows.NAME]           # one workflow, overriding [defaults]
prompt = "…"
```

The file is read on every call (terminal messages are rare), so an edit takes effect for
the next run that ends. Prompts steer a model, so a file that others may write is refused.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pi_workflows.plugin import InvalidInputError, config_dir

FILE_NAMES = ("markdown-results.toml", "markdown-results.json")
DEFAULT_MAX_VALUE_CHARS = 4000
_KEYS = {"prompt": str, "failure_prompt": str, "max_value_chars": int}


@dataclass(frozen=True)
class WorkflowSettings:
    """The settings that apply to one workflow: its section over `[defaults]`."""

    prompt: str | None = None
    failure_prompt: str | None = None
    max_value_chars: int = DEFAULT_MAX_VALUE_CHARS


@dataclass(frozen=True)
class MarkdownConfig:
    path: Path
    defaults: dict[str, Any]
    workflows: dict[str, dict[str, Any]]

    def for_workflow(self, name: str) -> WorkflowSettings:
        return WorkflowSettings(**{**self.defaults, **self.workflows.get(name, {})})


def config_path() -> Path | None:
    """The first configuration file that exists, or None (the plugin is then inert)."""
    for name in FILE_NAMES:
        path = config_dir() / name
        if path.exists():
            return path
    return None


def load_config() -> MarkdownConfig | None:
    path = config_path()
    if path is None:
        return None
    mode = os.stat(path).st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise InvalidInputError(f"{path} is writable by others; run 'chmod 600 {path}'.")
    raw = path.read_bytes()
    try:
        data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidInputError(f"{path} is not valid {path.suffix[1:].upper()}: {error}") from None
    if not isinstance(data, dict) or set(data) - {"defaults", "workflows"}:
        raise InvalidInputError(f"{path}: only [defaults] and [workflows.NAME] tables are allowed")
    workflows = data.get("workflows", {})
    if not isinstance(workflows, dict):
        raise InvalidInputError(f"{path}: [workflows] must be a table of workflow names")
    return MarkdownConfig(
        path,
        _section(path, "defaults", data.get("defaults", {})),
        {name: _section(path, f"workflows.{name}", section) for name, section in workflows.items()},
    )


def _section(path: Path, where: str, section: Any) -> dict[str, Any]:
    if not isinstance(section, dict):
        raise InvalidInputError(f"{path}: [{where}] must be a table")
    for key, value in section.items():
        expected = _KEYS.get(key)
        if expected is None:
            raise InvalidInputError(
                f"{path}: [{where}] has unknown key {key!r}; allowed: {', '.join(_KEYS)}"
            )
        if type(value) is not expected or (expected is str and not value.strip()):
            raise InvalidInputError(
                f"{path}: [{where}] {key} must be a non-empty {expected.__name__}"
            )
    if section.get("max_value_chars", DEFAULT_MAX_VALUE_CHARS) < 200:
        raise InvalidInputError(f"{path}: [{where}] max_value_chars must be at least 200")
    return dict(section)
