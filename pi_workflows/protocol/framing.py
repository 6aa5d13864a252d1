"""Newline-delimited JSON frames with a size limit (SPEC §7.2, §8)."""

from __future__ import annotations

import json
from typing import Any, TypeGuard

from ..canonical import canonical_json
from ..strict_json import DECODER, UNIQUE_KEYS_DECODER

MAX_FRAME_BYTES = 1024 * 1024  # including the newline
# Host <-> worker pipes carry whole run snapshots (every node output up to the limits of
# pi_workflows.limits), so their lines may be longer than client frames.
MAX_WORKER_FRAME_BYTES = 64 * 1024 * 1024
MAX_ERROR_CHARS = 1000
MAX_ID_BYTES = 256


class FrameError(ValueError):
    """A frame that cannot be accepted; the connection that sent it is closed."""


def encode_frame(message: dict[str, Any], limit: int = MAX_FRAME_BYTES) -> bytes:
    data = canonical_json(message).encode("utf-8") + b"\n"
    if len(data) > limit:
        raise FrameError(f"Protocol message exceeds {limit // (1024 * 1024)} MiB")
    return data


def decode_frame(
    line: bytes, limit: int = MAX_FRAME_BYTES, *, unique_keys: bool = False
) -> dict[str, Any]:
    """The object in one frame. Any JSON spelling is read (the host works on the canonical
    form, SPEC §6); with `unique_keys` (client frames), a repeated key is refused, since
    which value counts would depend on the parser."""
    if len(line) > limit:
        raise FrameError(f"Protocol message exceeds {limit // (1024 * 1024)} MiB")
    decoder = UNIQUE_KEYS_DECODER if unique_keys else DECODER
    try:
        # As json.loads reads bytes: UTF-8, -16 or -32 by their first bytes.
        value = decoder.decode(line.decode(json.detect_encoding(line), "surrogatepass"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
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


def valid_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and 0 < len(value.encode("utf-8")) <= MAX_ID_BYTES
