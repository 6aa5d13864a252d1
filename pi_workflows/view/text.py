"""Runs, steps and transcripts as short text: what the viewer's lists and panes show (and
`run transcript` prints), kept free of any terminal framework."""

from __future__ import annotations

import json
import time
from typing import Any

from ..lineage import continued_as
from .graph import GLYPHS, format_elapsed

# A run's status as one of the graph's node glyphs.
RUN_GLYPHS = {
    "queued": GLYPHS["pending"],
    "running": GLYPHS["running"],
    "waiting": GLYPHS["waiting"],
    "completed": GLYPHS["done"],
    "failed": GLYPHS["failed"],
    "timed_out": GLYPHS["failed"],
    "cancelled": GLYPHS["failed"],
}
STEP_GLYPHS = {"ok": GLYPHS["done"]}  # any other outcome failed


def run_glyph(run: dict[str, Any]) -> str:
    return RUN_GLYPHS.get(run["status"], "?")


def age(created_at_ms: int | None, now_ms: int) -> str:
    """`42s`, `5m`, `3h`, `2d`: how long ago a run was created."""
    if created_at_ms is None:
        return ""
    seconds = max(now_ms - created_at_ms, 0) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def run_reason(run: dict[str, Any]) -> str:
    """Why a run is where it is, in a few words (the runs list's last column)."""
    continuation = run.get("continuation")
    if continuation:
        return continued_as(continuation)
    if run.get("paused") and run["status"] not in ("completed", "failed", "timed_out"):
        return "paused"
    if run.get("errorCode"):
        return str(run["errorCode"])
    if run["status"] == "waiting":
        return run.get("statusDetail") or "waiting for an answer"
    return run.get("statusDetail") or ""


def step_line(number: int, step: dict[str, Any], *, waiting: bool = False) -> str:
    """`3 ✓ classify  1s` (a running step: its glyph and no duration; the step a run
    waits at, `waiting`: the waiting glyph)."""
    if step.get("outcome") is None:
        return f"{number} {GLYPHS['running']} {step['nodeId']}"
    if waiting:
        return f"{number} {GLYPHS['waiting']} {step['nodeId']}"
    glyph = STEP_GLYPHS.get(step["outcome"], GLYPHS["failed"])
    duration = step.get("durationMs")
    took = f"  {format_elapsed(duration)}" if duration is not None else ""
    return f"{number} {glyph} {step['nodeId']}{took}"


def pretty(value: Any) -> str:
    """A value for a pane: text as it is, anything else as indented JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def transcript_line(entry: dict[str, Any]) -> str:
    """One transcript entry as `HH:MM:SS.mmm kind: details`, multi-line text indented."""
    stamp = time.strftime("%H:%M:%S", time.gmtime(entry.get("at", 0) / 1000))
    stamp += f".{entry.get('at', 0) % 1000:03d}"
    fields = {key: value for key, value in entry.items() if key not in ("kind", "at")}
    text = fields.pop("text", None)
    head = " ".join(
        f"{key}={value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        for key, value in fields.items()
    )
    line = f"{stamp} {entry.get('kind')}" + (f" {head}" if head else "")
    if text:
        line += "\n" + "\n".join(f"    {part}" for part in str(text).splitlines())
    return line
