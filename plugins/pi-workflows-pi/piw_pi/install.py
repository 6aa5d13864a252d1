"""`pi-workflows pi install` / `uninstall`: plain `pi` loads the session extension.

Install lists the extension under `extensions` in Pi's global settings file (Pi's own way
to load a local extension on every start; docs/settings.md of Pi) and links the `pi` that
`npm ci` installed into a directory on PATH (by default the scripts directory of this
Python environment, where `pi-workflows` itself is). What it changed is written down in a
receipt (`<config>/pi-install.json`), so uninstall undoes exactly that and nothing a person
had set up before.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pi_workflows.plugin import InvalidInputError, config_dir, ensure_private_dir

from .node import BUNDLED_PI, DISTRIBUTION_DIR, SESSION_EXTENSION

AGENT_DIR_ENV = "PI_CODING_AGENT_DIR"
RECEIPT_NAME = "pi-install.json"


def agent_dir() -> Path:
    """Pi's global configuration directory: `PI_CODING_AGENT_DIR`, else `~/.pi/agent`."""
    override = os.environ.get(AGENT_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".pi" / "agent"


def settings_file() -> Path:
    return agent_dir() / "settings.json"


def default_bin_dir() -> Path:
    """The scripts directory of this Python environment (a venv's `bin`)."""
    return Path(sysconfig.get_path("scripts"))


def read_settings(path: Path) -> dict[str, Any]:
    """Pi's settings as a dict ({} when there is no file); a broken file is an error."""
    try:
        settings = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise InvalidInputError(
            f"Pi's settings file {path} cannot be read as JSON ({error}); fix it and run again."
        ) from None
    if not isinstance(settings, dict):
        raise InvalidInputError(f"Pi's settings file {path} is not a JSON object; fix it.")
    return settings


def registered_extensions(settings: dict[str, Any], base: Path) -> list[Path]:
    """The `extensions` entries of a settings file, as paths (relative ones from `base`)."""
    entries = settings.get("extensions")
    if not isinstance(entries, list):
        return []
    found = []
    for entry in entries:
        if isinstance(entry, str) and entry and entry[0] not in "!+-":
            found.append(base / Path(entry).expanduser())
    return found


def extension_registered(settings: dict[str, Any], base: Path) -> bool:
    target = SESSION_EXTENSION.resolve()
    return any(_same_file(path, target) for path in registered_extensions(settings, base))


def _same_file(path: Path, target: Path) -> bool:
    try:
        return path.resolve() == target or path.resolve() == target.parent
    except OSError:
        return False


def _write_json(path: Path, value: dict[str, Any], mode: int = 0o600) -> None:
    """Replace `path` in one step, keeping the mode an existing file had."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        pass
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(value, out, indent=2)
            out.write("\n")
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@dataclass
class Receipt:
    """What install changed: the entry it added to a settings file, the link it made."""

    settings_file: str | None = None
    extension_entry: str | None = None
    link: str | None = None

    @staticmethod
    def path() -> Path:
        return config_dir() / RECEIPT_NAME

    @classmethod
    def load(cls) -> Receipt:
        try:
            raw = json.loads(cls.path().read_text())
        except (OSError, ValueError):
            return cls()
        if not isinstance(raw, dict):
            return cls()
        return cls(raw.get("settingsFile"), raw.get("extensionEntry"), raw.get("link"))

    def save(self) -> None:
        if self.settings_file is None and self.link is None:
            self.path().unlink(missing_ok=True)
            return
        ensure_private_dir(self.path().parent)
        _write_json(
            self.path(),
            {
                "settingsFile": self.settings_file,
                "extensionEntry": self.extension_entry,
                "link": self.link,
            },
        )


def _is_our_link(path: Path) -> bool:
    return path.is_symlink() and Path(os.readlink(path)) == BUNDLED_PI


def install(bin_dir: Path) -> list[str]:
    """Register the extension and link `pi` into `bin_dir`; one line per thing done."""
    if not BUNDLED_PI.exists():
        raise InvalidInputError(
            f"Pi is not installed here: run 'npm ci' in {DISTRIBUTION_DIR} first, then again."
        )
    receipt = Receipt.load()
    settings_path = settings_file()
    settings = read_settings(settings_path)
    lines = []
    if extension_registered(settings, settings_path.parent):
        lines.append(f"extension: already listed in {settings_path}")
    else:
        entry = str(SESSION_EXTENSION.resolve())
        extensions = settings.get("extensions")
        settings["extensions"] = [*(extensions if isinstance(extensions, list) else []), entry]
        _write_json(settings_path, settings)
        receipt.settings_file, receipt.extension_entry = str(settings_path), entry
        lines.append(f"extension: added to 'extensions' in {settings_path}")
    lines.append(_link_pi(bin_dir, receipt))
    receipt.save()
    return lines


def _link_pi(bin_dir: Path, receipt: Receipt) -> str:
    link = bin_dir / "pi"
    if _is_our_link(link):
        made = f"pi: {link} already runs {BUNDLED_PI}"
    elif link.exists() or link.is_symlink():
        return (
            f"pi: left {link} alone (it is not this installation's); run Pi as {BUNDLED_PI} "
            "or give --bin-dir another directory on PATH"
        )
    else:
        bin_dir.mkdir(parents=True, exist_ok=True)
        link.symlink_to(BUNDLED_PI)
        receipt.link = str(link)
        made = f"pi: linked {link} -> {BUNDLED_PI}"
    found = shutil.which("pi")
    if found is not None and Path(found).resolve() == BUNDLED_PI.resolve():
        return made
    if found is None:
        return f'{made}; {bin_dir} is not on PATH: run export PATH="{bin_dir}:$PATH"'
    return f'{made}; but PATH finds {found} first: run export PATH="{bin_dir}:$PATH"'


def uninstall() -> list[str]:
    """Undo what install did (as its receipt says); one line per thing undone."""
    receipt = Receipt.load()
    lines = []
    if receipt.settings_file and receipt.extension_entry:
        path = Path(receipt.settings_file)
        settings = read_settings(path)
        extensions = settings.get("extensions")
        if isinstance(extensions, list) and receipt.extension_entry in extensions:
            settings["extensions"] = [e for e in extensions if e != receipt.extension_entry]
            if not settings["extensions"]:
                del settings["extensions"]
            _write_json(path, settings)
            lines.append(f"extension: removed from 'extensions' in {path}")
        receipt.settings_file = receipt.extension_entry = None
    if receipt.link:
        link = Path(receipt.link)
        if _is_our_link(link):
            link.unlink()
            lines.append(f"pi: removed the link {link}")
        receipt.link = None
    receipt.save()
    return lines or ["nothing to undo: 'pi-workflows pi install' changed nothing here"]
