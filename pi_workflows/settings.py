"""Settings: one typed registry that the environment and the settings file both go through.

A setting's value comes from its environment variable (``PI_WORKFLOWS_<KEY>``) when that is
set and not empty, else from ``<config>/settings.toml`` (``pi-workflows config set``), else
from its default. Every value is checked by its kind wherever it comes from: a bad one is
refused with one line that names the variable or the file, never used half-parsed.

The host resolves every setting once when it starts (`resolve`) and shows each value with
its source in ``host status``; its workers get the file's values through their environment,
so a worker sees exactly the settings its host started with. Host-level settings are the
ones a client compares with the running host's (`differences`): a shell that asks for other
ones is told to ``pi-workflows host restart``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from .canonical import sha256_hex
from .durations import duration_ms
from .errors import PiWorkflowsError
from .home import config_dir
from .safety_wording import LANGUAGES
from .worker_memory import size_bytes

ENV_PREFIX = "PI_WORKFLOWS_"
FILE_NAME = "settings.toml"

Source = Literal["env", "file", "default"]
Value = int | float | str | bool | None


class SettingError(PiWorkflowsError):
    """A setting's value (from the environment, the file or the command line) is invalid."""


def _positive_int(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ValueError("a positive integer")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("a positive integer") from None
    if value < 1:
        raise ValueError("a positive integer")
    return value


def _positive_number(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError("a positive number")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("a positive number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("a positive number")
    return value


def _text(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("a non-empty text")
    return raw.strip()


def _switch(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("on or off (1/0, true/false)")


def _duration(raw: object) -> str:
    text = str(raw).strip()
    duration_ms(text)
    return text


def _language(raw: object) -> str:
    text = str(raw).strip().lower()
    if text not in LANGUAGES:
        raise ValueError(f"one of {', '.join(LANGUAGES)}")
    return text


def _size(raw: object) -> str:
    text = str(raw).strip()
    size_bytes(text)
    return text


@dataclass(frozen=True)
class Setting:
    """One setting: its key in the file, its kind, default and what it does."""

    key: str
    parse: Callable[[object], Value]
    default: Value
    description: str
    # Compared between a client and the running host: the host's workers act on it.
    host_level: bool = True
    # Never shown: `host status` says only whether it is set.
    secret: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    def check(self, raw: object, origin: str) -> Value:
        """`raw` as this setting's value; `origin` names where it came from in the error."""
        try:
            return self.parse(raw)
        except ValueError as error:
            raise SettingError(f"{origin} must be {error}, got {raw!r}.") from None

    def shown(self, value: Value) -> Value:
        """The value as status output may show it."""
        if self.secret and value is not None:
            return "(set)"
        return value


# The registry, in the order `config list` and `host status` show it. Defaults of lease and
# timer settings are the production ones; tests shorten them through the environment.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "agent_executor",
        _text,
        "command",
        "the agent executor of headless runs (command, or a plugin's, e.g. pi)",
    ),
    Setting(
        "agent_command",
        _text,
        None,
        "the command the `command` executor pipes each step prompt to",
        secret=True,
    ),
    Setting("pi_command", _text, None, "the `pi` executable (default: the one npm ci installed)"),
    Setting("pi_model", _text, None, "the model of the `pi` executor (provider/model)"),
    Setting("pi_args", _text, None, "extra `pi` arguments, split like a shell", secret=True),
    Setting("max_workers", _positive_int, 4, "runs the host executes at once"),
    Setting(
        "max_node_crashes", _positive_int, 3, "workers a node may kill in a row before parking"
    ),
    Setting("claim_window", _positive_int, 64, "queued runs one claim pass looks at"),
    Setting(
        "hook_timeout_ms",
        _positive_int,
        1000,
        "how long one plugin hook call the host waits for or notifies may take",
    ),
    Setting("run_lease_ms", _positive_int, 30_000, "how long a run's claim lasts unrenewed"),
    Setting("host_lease_ms", _positive_int, 15_000, "how long a host's lease lasts unrenewed"),
    Setting("heartbeat_s", _positive_number, 5.0, "how often the host renews its leases"),
    Setting("poll_s", _positive_number, 2.0, "how often the host polls for due work"),
    Setting("worker_startup_s", _positive_number, 15.0, "how long a worker may take to start"),
    Setting(
        "stop_wait_s",
        _positive_number,
        10.0,
        "how long a stop waits for workers (the host exits 5 s later regardless)",
    ),
    Setting(
        "terminal_view_ms",
        _positive_int,
        60_000,
        "how long a finished run stays in its session's view (retention)",
    ),
    Setting("host_log_max_bytes", _positive_int, 10 * 1024 * 1024, "host log size per file"),
    Setting("max_connections", _positive_int, 256, "client connections the host accepts"),
    Setting("idle_connection_s", _positive_number, 30.0, "when idle client connections close"),
    Setting("channel_call_timeout_s", _positive_number, 30.0, "a decision channel call's limit"),
    Setting(
        "discovery_timeout_s",
        _positive_number,
        10.0,
        "how long loading one workflow file may take",
        host_level=False,
    ),
    Setting(
        "discovery_memory_mb",
        _positive_number,
        2048.0,
        "memory loading one workflow file may use",
        host_level=False,
    ),
    Setting(
        "worker_memory",
        _size,
        None,
        "memory (address space) one worker, and each process it starts, may use, e.g. 2G",
    ),
    Setting("fork_server", _switch, True, "start workers from a pre-imported fork server"),
    Setting(
        "retention",
        _duration,
        "30d",
        "how long finished runs are kept before the host prunes them (0: keep all)",
    ),
    Setting("retention_sweep_s", _positive_number, 86_400.0, "how often the host prunes"),
    Setting(
        "terminal_language",
        _language,
        "en",
        "the language of terminal messages' safety wording (en, de, es, fr)",
    ),
)
BY_KEY: dict[str, Setting] = {setting.key: setting for setting in SETTINGS}


def setting(key: str) -> Setting:
    """The setting named `key`; an unknown key is refused with the known ones."""
    try:
        return BY_KEY[key]
    except KeyError:
        known = ", ".join(BY_KEY)
        raise SettingError(f"No setting named {key!r}; settings: {known}.") from None


def settings_path(directory: Path | None = None) -> Path:
    """`<config>/settings.toml`."""
    return (directory or config_dir()) / FILE_NAME


def read_file(path: Path | None = None, *, known_keys_only: bool = True) -> dict[str, Any]:
    """The settings file's table (empty when there is none), refused whole when malformed
    or, unless `known_keys_only` is off, when it names a setting that does not exist."""
    path = path or settings_path()
    try:
        with open(path, "rb") as file:
            content = file.read()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise SettingError(f"{path} cannot be read: {error.strerror}.") from None
    # Imported only now: every client command that talked to a live host reads the
    # settings (`cli.context.warn_if_settings_differ`), and most find no file to parse.
    import tomllib

    try:
        table = tomllib.loads(content.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise SettingError(f"{path} is not valid TOML ({error}); fix or remove it.") from None
    for key in table if known_keys_only else ():
        if key not in BY_KEY:
            raise SettingError(
                f"{path} has an unknown setting {key!r}; remove it with "
                f"`pi-workflows config unset {key}` (settings: {', '.join(BY_KEY)})."
            )
    return table


def write_file(table: Mapping[str, Any], path: Path | None = None) -> Path:
    """Replace the settings file atomically (mode 0600, in a 0700 config directory)."""
    import tempfile  # here, as tomllib in `read_file`: only `config set` and `unset` write

    import tomli_w

    path = path or settings_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    ordered = {key: table[key] for key in (*BY_KEY, *sorted(table)) if key in table}
    descriptor, temporary = tempfile.mkstemp(prefix=".settings-", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:  # mkstemp made it 0600
            tomli_w.dump(ordered, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True)
class Resolved:
    """A setting's effective value and where it came from."""

    setting: Setting
    value: Value
    source: Source


def resolve_one(
    item: Setting, env: Mapping[str, str], table: Mapping[str, Any], path: Path
) -> Resolved:
    raw = env.get(item.env, "")
    if raw.strip():
        return Resolved(item, item.check(raw, item.env), "env")
    if item.key in table:
        return Resolved(item, item.check(table[item.key], f"{item.key} in {path}"), "file")
    return Resolved(item, item.default, "default")


class Settings:
    """Every setting's effective value and source, resolved at one moment."""

    def __init__(self, resolved: Mapping[str, Resolved]) -> None:
        self._resolved = dict(resolved)

    def __getitem__(self, key: str) -> Value:
        return self._resolved[setting(key).key].value

    def integer(self, key: str) -> int:
        return _kind(key, self[key], int)

    def number(self, key: str) -> float:
        return _kind(key, self[key], float)

    def text(self, key: str) -> str:
        return _kind(key, self[key], str)

    def switch(self, key: str) -> bool:
        return _kind(key, self[key], bool)

    def source(self, key: str) -> Source:
        return self._resolved[setting(key).key].source

    def describe(self) -> list[dict[str, Any]]:
        """Each setting for status output: key, variable, value (secrets masked), source."""
        return [
            {
                "key": item.setting.key,
                "env": item.setting.env,
                "value": item.setting.shown(item.value),
                "source": item.source,
            }
            for item in self._resolved.values()
        ]

    def file_environment(self) -> dict[str, str]:
        """The file's values as environment variables, for the processes a host starts."""
        return {
            item.setting.env: _as_text(item.value)
            for item in self._resolved.values()
            if item.source == "file"
        }

    def fingerprints(self) -> dict[str, str]:
        """A digest of each host-level value: compared without the value leaving the host."""
        return {
            key: fingerprint(item.value)
            for key, item in self._resolved.items()
            if item.setting.host_level
        }


_K = TypeVar("_K", int, float, str, bool)


def _kind(key: str, found: Value, kind: type[_K]) -> _K:
    """`found` as the `kind` the caller reads setting `key` as (an int is a number too);
    a TypeError when the registry's parser gives another kind: a bug, not bad input."""
    if kind is float and isinstance(found, int) and not isinstance(found, bool):
        return kind(found)
    if isinstance(found, kind) and (kind is bool or not isinstance(found, bool)):
        return found
    raise TypeError(f"Setting {key} is not read as {kind.__name__}: {found!r}.")


def _as_text(value: Value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def fingerprint(value: Value) -> str:
    return sha256_hex(repr(value))[:16]


def resolve(env: Mapping[str, str] | None = None, directory: Path | None = None) -> Settings:
    """Every setting from `env` (default: this process's), the file, or its default."""
    env = os.environ if env is None else env
    path = settings_path(directory)
    table = read_file(path)
    return Settings({item.key: resolve_one(item, env, table, path) for item in SETTINGS})


# The file's table per file version: readers on hot paths ask freely.
_file_cache: tuple[tuple[Any, ...], dict[str, Any]] | None = None


def _current_file(path: Path) -> dict[str, Any]:
    global _file_cache
    try:
        stat = path.stat()
        version: tuple[Any, ...] = (str(path), stat.st_mtime_ns, stat.st_size, stat.st_ino)
    except OSError:
        version = (str(path),)
    if _file_cache is None or _file_cache[0] != version:
        _file_cache = (version, read_file(path))
    return _file_cache[1]


def value(key: str) -> Value:
    """One setting's effective value in this process: only that setting is checked."""
    item = setting(key)
    path = settings_path()
    return resolve_one(item, os.environ, _current_file(path), path).value


def integer(key: str) -> int:
    """`value(key)` of an integer setting."""
    return _kind(key, value(key), int)


def number(key: str) -> float:
    """`value(key)` of a number setting."""
    return _kind(key, value(key), float)


def text(key: str) -> str:
    """`value(key)` of a text setting with a default."""
    return _kind(key, value(key), str)


def optional_text(key: str) -> str | None:
    """`value(key)` of a text setting without a default: None when it is not set."""
    found = value(key)
    return None if found is None else _kind(key, found, str)


def differences(host_fingerprints: Mapping[str, str], env: Mapping[str, str]) -> list[Setting]:
    """The host-level settings this client asks for (its environment or the file) that the
    running host does not use."""
    path = settings_path()
    table = _current_file(path)
    different = []
    for item in SETTINGS:
        if not item.host_level or item.key not in host_fingerprints:
            continue
        try:
            ours = resolve_one(item, env, table, path)
        except SettingError:
            continue  # the command that reads it says so; this is only a hint
        if ours.source == "default":
            continue  # a client that asks for nothing asks for nothing different
        if fingerprint(ours.value) != host_fingerprints[item.key]:
            different.append(item)
    return different
