"""Non-terminal updates (engine.md §6.1): envelope checks and the per-run rate limit."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from ..canonical import canonical_bytes, is_json_value
from ..errors import InvalidInputError

TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9.-]{0,63}$")
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
MAX_DATA_BYTES = 64 * 1024
RATE_PER_SECOND = 20.0
BURST = 100


def check_update(type: Any, key: Any, data: Any) -> None:
    """Refuse an envelope the reference would refuse, with the reason."""
    if not isinstance(type, str) or not TYPE_PATTERN.match(type):
        raise InvalidInputError(f"Update type {type!r} must match {TYPE_PATTERN.pattern}.")
    if not isinstance(key, str) or not KEY_PATTERN.match(key):
        raise InvalidInputError(f"Update key {key!r} must match {KEY_PATTERN.pattern}.")
    if not isinstance(data, dict) or not is_json_value(data):
        raise InvalidInputError("Update data must be a JSON object.")
    size = len(canonical_bytes(data))
    if size > MAX_DATA_BYTES:
        raise InvalidInputError(
            f"Update data is {size} bytes encoded; the limit is {MAX_DATA_BYTES}."
        )


class TokenBucket:
    """20 updates per second sustained, bursts of 100; refused updates are not queued."""

    def __init__(self, rate: float = RATE_PER_SECOND, burst: int = BURST) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.refilled_at = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.refilled_at) * self.rate)
            self.refilled_at = now
            if self.tokens < 1:
                raise InvalidInputError(
                    "Too many updates: at most 20 per second (bursts of 100); publish less often."
                )
            self.tokens -= 1
