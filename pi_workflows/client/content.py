"""Putting back the values an answer carried as content references (SPEC §8).

A host answer too big for one frame has its largest values replaced by
``{"$content": {"sha256", "bytes"}}``; the client reads each with ``content.read`` in
chunks on the same connection, checks every chunk's place and the whole value's sha256,
and puts the parsed value back where the reference was.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from typing import Any

from ..errors import PiWorkflowsError

CONTENT_KEY = "$content"

# (sha256, bytes, offset) -> the content.read receipt
ChunkReader = Callable[[str, int, int], dict[str, Any]]


class ContentError(PiWorkflowsError):
    """A referenced value could not be read back intact."""


def has_references(value: Any) -> bool:
    if isinstance(value, dict):
        return _reference(value) is not None or any(has_references(v) for v in value.values())
    if isinstance(value, list):
        return any(has_references(item) for item in value)
    return False


def materialize(value: Any, read_chunk: ChunkReader) -> Any:
    """`value` with every content reference replaced by the value it stands for."""
    reference = _reference(value) if isinstance(value, dict) else None
    if reference is not None:
        return _read_whole(reference, read_chunk)
    if isinstance(value, dict):
        return {key: materialize(child, read_chunk) for key, child in value.items()}
    if isinstance(value, list):
        return [materialize(item, read_chunk) for item in value]
    return value


def _reference(value: dict[str, Any]) -> dict[str, Any] | None:
    if set(value) != {CONTENT_KEY} or not isinstance(value[CONTENT_KEY], dict):
        return None
    reference = value[CONTENT_KEY]
    ok = isinstance(reference.get("sha256"), str) and type(reference.get("bytes")) is int
    return reference if ok else None


def _read_whole(reference: dict[str, Any], read_chunk: ChunkReader) -> Any:
    sha, size = reference["sha256"], reference["bytes"]
    data = bytearray()
    while len(data) < size:
        receipt = read_chunk(sha, size, len(data))
        try:
            chunk = base64.b64decode(receipt["chunk"], validate=True)
        except (KeyError, TypeError, binascii.Error):
            raise ContentError(f"A chunk of content {sha[:16]}… is invalid.") from None
        if (
            receipt.get("offset") != len(data)
            or not chunk
            or receipt.get("nextOffset") != len(data) + len(chunk)
            or len(data) + len(chunk) > size
        ):
            raise ContentError(f"A chunk of content {sha[:16]}… is invalid.")
        data += chunk
    if hashlib.sha256(data).hexdigest() != sha:
        raise ContentError(f"Content {sha[:16]}… does not match its sha256; repeat the request.")
    try:
        return json.loads(data)
    except ValueError:
        raise ContentError(f"Content {sha[:16]}… is not valid JSON.") from None
