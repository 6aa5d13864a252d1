"""Durations and moments as people write them in settings and options: `30d`, `12h`,
`90m`, `45s`, `0`; `2026-01-31` or `2026-01-31T12:00:00+01:00`."""

from __future__ import annotations

import datetime
import re
from typing import Any

from .errors import InvalidInputError

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+)([smhd])")


def duration_ms(text: str) -> int:
    """`text` in milliseconds; ValueError (saying what is expected) when it is not one."""
    text = text.strip()
    if text == "0":
        return 0
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError("a duration such as 30d, 12h, 90m or 45s (0: never)")
    return int(match[1]) * _UNIT_MS[match[2]]


def parse_before(value: Any) -> int:
    """A cut-off as an ISO 8601 date or time (UTC unless it says otherwise), in epoch ms."""
    if not isinstance(value, str):
        raise InvalidInputError("before must be an ISO 8601 date or time, e.g. 2026-01-31")
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(
            f"before must be an ISO 8601 date or time, e.g. 2026-01-31; got {value!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)
