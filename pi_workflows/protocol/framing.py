"""Newline-delimited JSON frames with a size limit (SPEC §7.2, §8)."""

from __future__ import annotations

import json
from typing import Any

from ..canonical import canonical_json

MAX_FRAME_BYTES = 1024 * 1024  # including the newline
MAX_ERROR_CHARS = 1000
MAX_ID_BYTES = 256


class FrameError(ValueError):
    """A frame that cannot be accepted; the connection that sent it is closed."""


def encode_frame(message: dict[str, Any]) -> bytes:
    data = canonical_json(message).encode("utf-8") + b"\n"
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError("Protocol message exceeds 1 MiB")
    return data


def decode_frame(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_FRAME_BYTES:
        raise FrameError("Protocol message exceeds 1 MiB")
    try:
        value = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"Protocol message is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise FrameError("Protocol message must be a JSON object")
    return value


def one_line_error(text: object) -> str:
    """Errors on the wire: one line, at most 1000 characters."""
    flat = " ".join(str(text).split()) or "Workflow request failed"
    if len(flat) > MAX_ERROR_CHARS:
        flat = flat[: MAX_ERROR_CHARS - 3] + "..."
    return flat


def valid_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value.encode("utf-8")) <= MAX_ID_BYTES
