"""Putting back the values an answer carried as content references (SPEC §8).

A host answer too big for one frame has its largest values replaced by
``{"$content": {"sha256", "bytes"}}``; the client reads each with ``content.read`` in
chunks on the same connection, checks every chunk's digest, place and size and the whole
value's sha256, and puts the parsed value back where the reference was. User objects
with a ``$content`` or ``$escaped`` key of their own arrive wrapped as
``{"$escaped": object}`` (protocol/content_values.py) and are unwrapped here, so they are
never read as references.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from typing import Any

from ..errors import PiWorkflowsError
from ..protocol.content_values import CONTENT_KEY, ESCAPE_KEY

# (sha256, bytes, offset) -> the content.read receipt
ChunkReader = Callable[[str, int, int], dict[str, Any]]


class ContentError(PiWorkflowsError):
    """A referenced value could not be read back intact."""


def needs_decoding(value: Any) -> bool:
    """Whether `value` holds a content reference or a wrapped user object."""
    if isinstance(value, dict):
        if CONTENT_KEY in value or ESCAPE_KEY in value:
            return True
        return any(map(needs_decoding, value.values()))
    if isinstance(value, list):
        return any(map(needs_decoding, value))
    return False


def materialize(value: Any, read_chunk: ChunkReader) -> Any:
    """`value` with every content reference replaced by the value it stands for and every
    wrapped user object unwrapped."""
    if isinstance(value, dict):
        if CONTENT_KEY in value:
            return materialize(_read_whole(_reference(value), read_chunk), read_chunk)
        if ESCAPE_KEY in value:
            inner = value[ESCAPE_KEY]
            if len(value) != 1 or not isinstance(inner, dict):
                raise ContentError("The host sent a malformed escaped value.")
            value = inner
        return {key: materialize(child, read_chunk) for key, child in value.items()}
    if isinstance(value, list):
        return [materialize(item, read_chunk) for item in value]
    return value


def _reference(value: dict[str, Any]) -> tuple[str, int]:
    reference = value[CONTENT_KEY]
    if (
        len(value) != 1
        or not isinstance(reference, dict)
        or set(reference) != {"sha256", "bytes"}
        or not isinstance(reference["sha256"], str)
        or type(reference["bytes"]) is not int
        or reference["bytes"] < 0
    ):
        raise ContentError("The host sent a malformed content reference.")
    return reference["sha256"], reference["bytes"]


def _read_whole(reference: tuple[str, int], read_chunk: ChunkReader) -> Any:
    sha, size = reference
    data = bytearray()
    while len(data) < size:
        receipt = read_chunk(sha, size, len(data))
        try:
            chunk = base64.b64decode(receipt["chunk"], validate=True)
        except (KeyError, TypeError, binascii.Error):
            raise ContentError(f"A chunk of content {sha[:16]}… is invalid.") from None
        if (
            receipt.get("sha256") != sha
            or receipt.get("offset") != len(data)
            or not chunk
            or receipt.get("nextOffset") != len(data) + len(chunk)
        ):
            raise ContentError(f"A chunk of content {sha[:16]}… is invalid.")
        if len(data) + len(chunk) > size:
            raise ContentError(
                f"Content {sha[:16]}… does not match its size ({size} bytes); repeat the request."
            )
        data += chunk
    if hashlib.sha256(data).hexdigest() != sha:
        raise ContentError(f"Content {sha[:16]}… does not match its sha256; repeat the request.")
    try:
        return json.loads(data)
    except ValueError:
        raise ContentError(f"Content {sha[:16]}… is not valid JSON.") from None
