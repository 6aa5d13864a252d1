"""Broken workflow files, remembered so that one that hangs at import (or is slow to
fail) costs its load deadline once, not on every `workflows` or `run start`.

A verdict is kept in `<home>/cache/broken-workflows.json` under the file's path, with
what it was given for: the file's mtime, size and sha256, and the load deadline and
memory limit. Any change to those loads the file again (so does `touch FILE`, for a file
whose own bytes did not change but something it imports did). A file that loads is
never remembered, and a fixed one is forgotten. Without a home there is no cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..canonical import sha256_hex
from ..home import ensure_private_dir, resolve_home
from .isolation import load_timeout_s, memory_limit_bytes

FILE_NAME = "broken-workflows.json"
MAX_VERDICTS = 256


def remembered(path: Path) -> dict[str, Any] | None:
    """The broken answer stored for `path` as it is now, if any."""
    cache = _cache_path()
    if cache is None:
        return None
    entry = _read(cache).get(str(path))
    if not isinstance(entry, dict) or entry.get("key") != _key(path):
        return None
    answer = entry.get("answer")
    return answer if isinstance(answer, dict) else None


def record(path: Path, answer: dict[str, Any]) -> None:
    """Keep a broken answer for `path`; forget the verdict of a file that loads now."""
    cache = _cache_path()
    if cache is None:
        return
    verdicts = _read(cache)
    if answer.get("error") is None:
        if str(path) not in verdicts:
            return
        verdicts.pop(str(path))
    else:
        key = _key(path)
        if key is None:
            return
        verdicts.pop(str(path), None)
        verdicts[str(path)] = {"key": key, "answer": answer}
        while len(verdicts) > MAX_VERDICTS:
            verdicts.pop(next(iter(verdicts)))  # the oldest verdict
    with contextlib.suppress(OSError):
        _write(cache, verdicts)


def _key(path: Path) -> str | None:
    try:
        info = path.stat()
        content = path.read_bytes()
    except OSError:
        return None
    return (
        f"{info.st_mtime_ns}:{info.st_size}:{sha256_hex(content)}:"
        f"{load_timeout_s():g}:{memory_limit_bytes()}"
    )


def _cache_path() -> Path | None:
    home = resolve_home()
    if not home.root.is_dir():
        return None
    return home.root / "cache" / FILE_NAME


def _read(cache: Path) -> dict[str, Any]:
    try:
        verdicts = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return verdicts if isinstance(verdicts, dict) else {}


def _write(cache: Path, verdicts: dict[str, Any]) -> None:
    """Replace the cache whole (another command may read it meanwhile)."""
    ensure_private_dir(cache.parent)
    descriptor, temporary = tempfile.mkstemp(prefix=".verdicts-", dir=cache.parent)
    try:
        with os.fdopen(descriptor, "w") as file:  # mkstemp made it 0600
            json.dump(verdicts, file, sort_keys=True)
        os.replace(temporary, cache)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
