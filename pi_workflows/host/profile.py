"""What a running host is made of, for `host status`: plugins, database, log, executor.

Nothing secret leaves here: a database URL's password is masked, and plugins are named with
their versions only.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from .. import plugins, settings
from ..home import Home
from ..storage.database import masked_url


def log_file() -> str | None:
    """The file this process's stderr (the host log) goes to, when it is a regular file."""
    try:
        if not stat.S_ISREG(os.fstat(2).st_mode):
            return None
        return os.readlink("/proc/self/fd/2")
    except OSError:  # no /proc (not Linux), or stderr closed
        return None


def host_profile(
    home: Home, database_url: str | None, host_settings: settings.Settings
) -> dict[str, Any]:
    """The host's plugins, plugin-set digest, database, log file, agent executor and
    settings (each with its source; secrets masked)."""
    executor = host_settings["agent_executor"]
    registered = sorted(plugins.agent_executor_factories())
    return {
        "plugins": [
            {key: entry[key] for key in ("name", "kind", "distribution", "version")}
            for entry in plugins.describe_plugins()
        ],
        "pluginSet": plugins.plugin_set_digest(),
        "database": masked_url(database_url) if database_url else str(home.database_path),
        "logFile": log_file(),
        "agentExecutor": {
            "name": executor,
            "registered": executor in registered,
            "available": registered,
        },
        "settings": host_settings.describe(),
    }
