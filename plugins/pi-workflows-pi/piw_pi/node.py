"""Where the distribution's Node side lives: the `pi` executable and the bundled extensions."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

PI_COMMAND_ENV = "PI_WORKFLOWS_PI_COMMAND"
PINNED_PI_VERSION = "0.73.1"

PACKAGE_DIR = Path(__file__).resolve().parent
# The folder holding package.json and, after `npm ci`, node_modules (an editable install).
DISTRIBUTION_DIR = PACKAGE_DIR.parent
SESSION_EXTENSION = PACKAGE_DIR / "extensions" / "session" / "index.ts"
BRIDGE_EXTENSION = PACKAGE_DIR / "extensions" / "bridge" / "index.ts"


def pi_command() -> str | None:
    """`PI_WORKFLOWS_PI_COMMAND`, else the `pi` installed by `npm ci` here, else `pi` on PATH."""
    override = os.environ.get(PI_COMMAND_ENV)
    if override:
        return override
    bundled = DISTRIBUTION_DIR / "node_modules" / ".bin" / "pi"
    if bundled.exists():
        return str(bundled)
    return shutil.which("pi")
