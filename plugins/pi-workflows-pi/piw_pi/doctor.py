"""`pi-workflows pi doctor`: is everything a Pi session needs in place? One line per check.

Each check returns `(ok, line)`; a failing line says what is wrong and how to fix it. The
model checks ask a real pi (without extensions, so no host is started) what Pi makes of
its configuration: the model it would use and the models it has keys for.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pi_workflows.plugin import AgentExecutorError, InvalidInputError

from .executor import PiSettings
from .install import agent_dir, extension_registered, read_settings, settings_file
from .models import MODEL_ENV, known_model, model_name
from .node import BUNDLED_PI, DISTRIBUTION_DIR, PINNED_PI_VERSION, SESSION_EXTENSION, pi_command
from .rpc import PiProcess, PiProcessError

MIN_NODE_MAJOR = 20
PROBE_TIMEOUT_S = 30
CONNECT_TIMEOUT_S = 3.0
INSTALL_HINT = "run 'pi-workflows pi install'"

Check = tuple[bool, str]


def _first_line(argv: list[str]) -> str | None:
    """The first line a program prints, or None when it cannot run."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else ""


def check_node() -> Check:
    version = _first_line(["node", "--version"])
    if version is None:
        return False, f"node: not found; install Node.js {MIN_NODE_MAJOR} or newer"
    major = re.match(r"v?(\d+)", version)
    if major is None or int(major.group(1)) < MIN_NODE_MAJOR:
        return False, f"node: {version} is too old; Pi needs Node.js {MIN_NODE_MAJOR} or newer"
    return True, f"node: ok ({version})"


def check_pi(settings: PiSettings | AgentExecutorError) -> Check:
    """The pi that headless steps run (the bundled one unless PI_WORKFLOWS_PI_COMMAND),
    started as they start it (`settings`: on the bundled Node through the launcher, when
    installed), or why they could not be made."""
    command = pi_command()
    hint = f"run 'npm ci' in {DISTRIBUTION_DIR} or set PI_WORKFLOWS_PI_COMMAND"
    if command is None:
        return False, f"pi: not found; {hint}"
    if isinstance(settings, AgentExecutorError):
        return False, f"pi: not checked ({settings})"
    version = _first_line([*settings.command, "--version"])
    if version is None:
        return False, f"pi: {command} does not run; {hint}"
    if version != PINNED_PI_VERSION:
        return False, f"pi: {version} at {command}; pi-workflows is tested with {PINNED_PI_VERSION}"
    return True, f"pi: ok ({version} at {command})"


def check_pi_on_path() -> Check:
    """The `pi` a person types: it should be the bundled one (or the same version)."""
    found = shutil.which("pi")
    if found is None:
        return False, f"pi on PATH: none; {INSTALL_HINT} (it links {BUNDLED_PI})"
    if BUNDLED_PI.exists() and Path(found).resolve() == BUNDLED_PI.resolve():
        return True, f"pi on PATH: ok ({found}, the bundled pi)"
    version = _first_line([found, "--version"])
    if version != PINNED_PI_VERSION:
        return False, (
            f"pi on PATH: {found} is Pi {version or '(does not run)'}, not {PINNED_PI_VERSION}; "
            f"{INSTALL_HINT} and put its directory first on PATH"
        )
    return True, f"pi on PATH: ok ({found}, Pi {version}; not the bundled one)"


def check_extension(cwd: Path) -> Check:
    """The extension file exists and plain `pi` loads it (global or project settings)."""
    if not SESSION_EXTENSION.is_file():
        return False, f"extension: {SESSION_EXTENSION} is missing; reinstall pi-workflows-pi"
    for path in (settings_file(), cwd / ".pi" / "settings.json"):
        try:
            if extension_registered(read_settings(path), path.parent):
                return True, f"extension: ok (listed in {path})"
        except InvalidInputError as error:  # an unreadable settings file fails this check
            return False, f"extension: {error}"
    return False, f"extension: plain pi does not load it; {INSTALL_HINT}"


def probe_models(settings: PiSettings) -> tuple[Any, list[dict[str, Any]] | None]:
    """Ask a pi (no extensions) for its model and its usable models: (state model, models)."""
    model = ["--model", settings.model] if settings.model else []
    argv = [
        *settings.command,
        *("--mode", "rpc", "--no-session", "--no-extensions"),
        *model,
        *settings.extra_args,
    ]
    process = PiProcess(argv, dict(os.environ), os.getcwd())
    try:
        state = process.send({"type": "get_state"}, PROBE_TIMEOUT_S)
        available = process.send({"type": "get_available_models"}, PROBE_TIMEOUT_S)
    finally:
        process.terminate()
    return (state.get("data") or {}).get("model"), (available.get("data") or {}).get("models")


def check_models(settings: PiSettings) -> list[Check]:
    """`models` (Pi has any), `model` (the configured one is known) and `provider`
    (its base URL accepts connections)."""
    requested = settings.model
    try:
        state_model, available = probe_models(settings)
    except PiProcessError as error:
        return [
            (
                False,
                f"model: pi could not start ({error}); check {MODEL_ENV} and `pi --list-models`",
            ),
            (False, "provider: not checked (no model)"),
        ]
    results: list[Check] = []
    directory = agent_dir()
    if not available:
        results.append(
            (
                False,
                (
                    f"models: Pi can use no model (no models.json or auth.json in {directory}, no "
                    f"provider API key set); write {directory / 'models.json'} (docs/pi.md) or set "
                    "your provider's API key variable"
                ),
            )
        )
    else:
        results.append((True, f"models: ok ({len(available)} Pi can use; config in {directory})"))
    try:
        model = known_model(state_model, available or [], requested)
    except AgentExecutorError as error:
        results += [(False, f"model: {error}"), (False, "provider: not checked (no model)")]
        return results
    origin = MODEL_ENV if requested else "Pi's default"
    results.append((True, f"model: ok ({model_name(model)}, {origin})"))
    results.append(check_provider(model))
    return results


def check_provider(model: dict[str, Any]) -> Check:
    base_url = str(model.get("baseUrl") or "")
    provider = model.get("provider")
    parts = urlsplit(base_url)
    if not parts.hostname:
        return False, f"provider: {provider} has no base URL ({base_url!r}); fix models.json"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        return False, (
            f"provider: {provider} at {base_url} is unreachable ({reason}); start it, or fix "
            f"baseUrl in {agent_dir() / 'models.json'}"
        )
    return True, f"provider: ok ({provider} at {base_url} accepts connections)"
