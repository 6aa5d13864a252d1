"""JSON as pi-workflows reads what clients and people send it.

NaN and Infinity are refused (they are not JSON), and so is a key an object repeats:
which of its values counts would depend on the parser, so the sender must say which.
"""

from __future__ import annotations

import json
from typing import Any


class NotJsonConstantError(ValueError):
    """NaN, Infinity or -Infinity in the text."""


class DuplicateKeyError(ValueError):
    """An object gives the same key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key[:40]!r}")
        self.key = key


def _refuse_constant(name: str) -> Any:
    raise NotJsonConstantError(f"{name} is not JSON")


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return value


# `json.loads` with options builds a decoder on every call; these are built once.
DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
UNIQUE_KEYS_DECODER = json.JSONDecoder(
    parse_constant=_refuse_constant, object_pairs_hook=_refuse_duplicate_keys
)
