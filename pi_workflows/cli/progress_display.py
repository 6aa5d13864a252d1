"""How `run watch` and `run start --wait` show a run's progress.

One line per ended node attempt (node, attempt, outcome, start → end, duration, error),
one per published update, and one whenever what holds the run changes (`run why`). On
a terminal, a spinner line below them names what is happening now and redraws in
place; piped output gets the plain lines only, so it can be read by a program.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, TextIO

from ..protocol.client_messages import ProgressKind

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
CLEAR_LINE = "\r\x1b[2K"


def clock(ms: int | None) -> str:
    if ms is None:
        return "?"
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S")


class ProgressDisplay:
    def __init__(self, stream: TextIO, *, live: bool) -> None:
        self.stream = stream
        self.live = live
        self.attempts: dict[str, int] = {}  # node id -> attempts started
        self.running: dict[str, tuple[str, float]] = {}  # attempt id -> (node, since)
        self.last_code: str | None = None
        self.status_text = "waiting for the host"
        self.frame = 0
        self._status_shown = False

    # --- feeding -------------------------------------------------------------------------

    def show(self, payload: dict[str, Any]) -> None:
        """One `run_progress` payload from the host."""
        for entry in payload["entries"]:
            self._entry(entry)
        why = payload["why"]
        if why["code"] != self.last_code and why["code"] != "running":
            self._line(f"{payload['runId']}: {why['reason']}")
        self.last_code = why["code"]
        self.status_text = why["reason"]
        if payload["settled"]:
            self._clear_status()
        else:
            self.tick()

    def _entry(self, entry: dict[str, Any]) -> None:
        kind = entry["kind"]
        if kind == ProgressKind.NODE_STARTED:
            node = entry["nodeId"]
            self.attempts[node] = self.attempts.get(node, 0) + 1
            self.running[entry["attemptId"]] = (node, time.monotonic())
        elif kind == ProgressKind.NODE_ENDED:
            node = entry["nodeId"]
            self.running.pop(entry["attemptId"], None)
            attempt = self.attempts.get(node, 1)
            text = (
                f"{node}  attempt {attempt}  {entry['outcome']}  "
                f"{clock(entry['startedAt'])} → {clock(entry['finishedAt'])}  "
                f"{entry['durationMs']} ms"
            )
            if entry.get("error"):
                text += f"  {entry['error']}"
            self._line(text)
        elif kind == ProgressKind.UPDATE:
            self._line(f"{entry['nodeId']}  update {entry['type']}/{entry['key']}  {entry['data']}")

    # --- drawing -------------------------------------------------------------------------

    def tick(self) -> None:
        """Redraw the spinner line (terminal only)."""
        if not self.live:
            return
        self.frame = (self.frame + 1) % len(SPINNER)
        if self.running:
            node, since = next(reversed(self.running.values()))
            now = f"{node} running {time.monotonic() - since:.1f} s"
        else:
            now = self.status_text
        self.stream.write(f"{CLEAR_LINE}{SPINNER[self.frame]} {now}")
        self.stream.flush()
        self._status_shown = True

    def _line(self, text: str) -> None:
        self._clear_status()
        self.stream.write(text + "\n")
        self.stream.flush()

    def _clear_status(self) -> None:
        if self._status_shown:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()
            self._status_shown = False
