"""Canonical JSON and the sha256 digests built on it (SPEC §4)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# `json.dumps` with these options builds an encoder on every call; every durable write
# serialises several values, so one encoder serves them all (it keeps no state between
# calls).
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> str:
    """Serialise `value` deterministically; NaN and infinities are refused."""
    return _ENCODER.encode(value)


def canonical_bytes(value: Any) -> bytes:
    return canonical_json(value).encode("utf-8")


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """sha256 (hex) of the canonical JSON of `value`: every fingerprint uses this."""
    return sha256_hex(canonical_bytes(value))


def is_json_value(value: Any) -> bool:
    """True when `value` survives a canonical JSON round trip unchanged in kind."""
    try:
        canonical_json(value)
    except (TypeError, ValueError):
        return False
    return True
