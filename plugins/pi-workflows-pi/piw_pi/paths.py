"""Where the Pi side of the plugin lives: the bundled extensions and the `pi` executable."""

from __future__ import annotations

import shutil
from pathlib import Path

DISTRIBUTION_DIR = Path(__file__).resolve().parent.parent
EXTENSIONS_DIR = DISTRIBUTION_DIR / "extensions"
BRIDGE_EXTENSION = EXTENSIONS_DIR / "bridge.ts"
BUNDLED_PI = DISTRIBUTION_DIR / "node_modules" / ".bin" / "pi"


def default_pi_command() -> str | None:
    """The `pi` installed by `npm ci` next to this package, else `pi` on PATH, else None."""
    if BUNDLED_PI.exists():
        return str(BUNDLED_PI)
    return shutil.which("pi")
