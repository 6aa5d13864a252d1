"""Answers over the 1 MiB client frame: large values travel as content references.

When a response would not fit one frame (`run.list` of runs with 500 KiB results, say),
its largest values are replaced, largest first, by ``{"$content": {"sha256", "bytes"}}``
— the sha256 and length of the value's canonical JSON — and the connection holds those
bytes. The client reads them with ``content.read {sha256, bytes, offset}`` in chunks that
each fit a frame, checks the digest and puts the value back (reference 3.16–3.18). Only
the connection the reference was sent on can read it; a reference the connection does not
hold (another connection's, or one dropped to bound memory) is ``notFound``. User values
that look like a reference are wrapped first (protocol/content_values.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections import OrderedDict
from typing import Any

from ..canonical import canonical_json
from ..errors import InvalidInputError, NotFoundError
from ..protocol.content_values import (
    CONTENT_KEY,
    ESCAPE_KEY,
    RESERVED_KEY_MARKERS,
    escape_user_values,
)
from ..protocol.framing import MAX_FRAME_BYTES, FrameError, encode_frame

# A chunk is sent base64-encoded (4/3 larger), so 256 KiB stays far below a frame.
CHUNK_BYTES = 256 * 1024
# Values smaller than this stay inline: a reference would save too little.
MIN_REFERENCE_BYTES = 16 * 1024
# What one connection holds for reading; the oldest references are dropped beyond it.
MAX_HELD_BYTES = 256 * 1024 * 1024


class HeldContent:
    """The referenced values one connection may read, by sha256, oldest first."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def hold(self, data: bytes) -> dict[str, Any]:
        sha = hashlib.sha256(data).hexdigest()
        if sha not in self._held:
            self._held[sha] = data
            self._bytes += len(data)
            while self._bytes > MAX_HELD_BYTES and len(self._held) > 1:
                _, dropped = self._held.popitem(last=False)
                self._bytes -= len(dropped)
        return {CONTENT_KEY: {"sha256": sha, "bytes": len(data)}}

    def read(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The `content.read` receipt: ``{sha256, offset, chunk (base64), nextOffset}``."""
        sha, size, offset = payload.get("sha256"), payload.get("bytes"), payload.get("offset")
        data = self._held.get(sha) if isinstance(sha, str) else None
        if data is None or size != len(data):
            raise NotFoundError(
                f"Content {str(sha)[:64]} is unavailable on this connection; repeat the "
                "request that referenced it."
            )
        if type(offset) is not int or not 0 <= offset < len(data):
            raise InvalidInputError(
                f"Content offset is invalid: {offset!r} (the content has {len(data)} bytes)."
            )
        chunk = data[offset : offset + CHUNK_BYTES]
        return {
            "sha256": sha,
            "offset": offset,
            "chunk": base64.b64encode(chunk).decode("ascii"),
            "nextOffset": offset + len(chunk),
        }


def frame_within_limit(message: dict[str, Any], held: HeldContent) -> bytes:
    """`message` as one frame: receipt values that look like references wrapped, its
    largest receipt values moved into `held` if need be."""
    if "receipt" not in message:
        return encode_frame(message)
    try:
        frame = encode_frame(message)
    except FrameError:
        frame = None
    if frame is not None and not any(marker in frame for marker in RESERVED_KEY_MARKERS):
        return frame
    message = {**message, "receipt": escape_user_values(message["receipt"])}
    if frame is not None:
        with contextlib.suppress(FrameError):  # the wrappers may take it over the limit
            return encode_frame(message)
    receipt = message["receipt"]
    excess = len(canonical_json(message).encode("utf-8")) + 1 - MAX_FRAME_BYTES
    for _size, path in sorted(_large_leaves(receipt), key=lambda found: -found[0]):
        if excess <= 0:
            break
        data = canonical_json(_at(receipt, path)).encode("utf-8")
        reference = held.hold(data)
        receipt = _replaced(receipt, path, reference)
        excess -= len(data) - len(canonical_json(reference))
    message = {**message, "receipt": receipt}
    try:
        return encode_frame(message)
    except FrameError:  # many medium values: the whole receipt becomes one reference
        whole = held.hold(canonical_json(message["receipt"]).encode("utf-8"))
        return encode_frame({**message, "receipt": whole})


def _large_leaves(value: Any, path: tuple = ()) -> list[tuple[int, tuple]]:
    """Paths of the smallest values over `MIN_REFERENCE_BYTES` (none of their parts is).

    An escape wrapper is moved whole or not at all: the object it wraps, on its own, would
    read as unwrapped (as a reference, even)."""
    size = len(canonical_json(value).encode("utf-8"))
    if size < MIN_REFERENCE_BYTES:
        return []
    children: list[tuple[tuple[str | int, ...], Any]]
    if isinstance(value, dict) and ESCAPE_KEY in value:
        inner = value[ESCAPE_KEY]
        children = [((ESCAPE_KEY, key), child) for key, child in inner.items()]
    elif isinstance(value, dict):
        children = [((key,), child) for key, child in value.items()]
    elif isinstance(value, list):
        children = [((index,), child) for index, child in enumerate(value)]
    else:
        children = []
    found = [leaf for keys, child in children for leaf in _large_leaves(child, (*path, *keys))]
    return found or [(size, path)]


def _at(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


def _replaced(value: Any, path: tuple, replacement: Any) -> Any:
    """A copy of `value` with the value at `path` replaced (the original is not changed)."""
    if not path:
        return replacement
    key, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, key: _replaced(value[key], rest, replacement)}
    copied = list(value)
    copied[key] = _replaced(value[key], rest, replacement)
    return copied
