"""The host's log: one line per record, repeats rate-limited, the file size-capped.

A flood (thousands of refused connections, an fd limit hit in a loop) must not fill a
disk: each kind of message (logger and template) is written at most `REPEAT_BURST`
times per `REPEAT_WINDOW_S`; the next one after a quiet spell says how many were
dropped. A background host logs to `<home>/logs/host.log`, rotated at
`PI_WORKFLOWS_HOST_LOG_MAX_BYTES` with two older files kept.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import time
from pathlib import Path

from .. import settings

LOG_BACKUPS = 2
REPEAT_BURST = 10
REPEAT_WINDOW_S = 60.0
FORMAT = "[pi-workflows host] %(message)s"


class RepeatLimiter(logging.Filter):
    """Lets through at most `burst` records of one kind per window of `window_s`."""

    def __init__(self, burst: int = REPEAT_BURST, window_s: float = REPEAT_WINDOW_S) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._windows: dict[tuple[str, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        started, seen, dropped = self._windows.get(key, (now, 0, 0))
        if now - started >= self.window_s:
            started, seen = now, 0
        if seen >= self.burst:
            self._windows[key] = (started, seen, dropped + 1)
            return False
        self._windows[key] = (started, seen + 1, 0)
        if dropped:
            record.msg = f"{record.msg} ({dropped} more like this were not logged)"
        return True


def configure_host_logging(log_file: Path | None) -> None:
    """Log to `log_file` (rotated) or to stderr, through the repeat limiter."""
    if log_file is None:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.handlers.RotatingFileHandler(
            log_file,
            maxBytes=settings.integer("host_log_max_bytes"),
            backupCount=LOG_BACKUPS,
            encoding="utf-8",
        )
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(RepeatLimiter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
