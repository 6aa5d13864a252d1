"""Content-addressed values: inputs, outputs, prompts, errors, message contents."""

from __future__ import annotations

from typing import Any

import peewee

from ..canonical import canonical_bytes, sha256_hex
from ..clock import now_ms
from ..errors import BlobConflictError
from .models import Blob

JSON = "application/json"
TEXT = "text/plain"


def _put(content: bytes, media_type: str) -> str:
    blob_hash = sha256_hex(content)
    stored = Blob.get_or_none(Blob.blob_hash == blob_hash)
    if stored is None:
        # Content-addressed: a concurrent writer can only have stored these same bytes.
        Blob.insert(
            blob_hash=blob_hash,
            media_type=media_type,
            byte_length=len(content),
            content=content,
            created_at=now_ms(),
        ).on_conflict_ignore().execute()
        return blob_hash
    if (
        stored.media_type != media_type
        or stored.byte_length != len(content)
        or bytes(stored.content) != content
    ):
        raise BlobConflictError(
            f"Content-addressed blob conflict for {blob_hash[:12]}: the stored value differs "
            "from its address; run 'pi-workflows state verify' and restore from a backup."
        )
    return blob_hash


def put_json(value: Any) -> str:
    """Store a JSON value by the sha256 of its canonical bytes; returns the hash."""
    return _put(canonical_bytes(value), JSON)


def put_text(text: str) -> str:
    return _put(text.encode("utf-8"), TEXT)


def _read(blob_hash: str, media_type: str) -> bytes:
    try:
        stored = Blob.get_by_id(blob_hash)
    except peewee.DoesNotExist:
        raise BlobConflictError(
            f"Blob {blob_hash[:12]} is missing from the state database."
        ) from None
    if stored.media_type != media_type:
        raise BlobConflictError(
            f"Blob {blob_hash[:12]} holds {stored.media_type}, expected {media_type}."
        )
    return bytes(stored.content)


def read_json(blob_hash: str | None) -> Any:
    if blob_hash is None:
        return None
    import json

    return json.loads(_read(blob_hash, JSON))


def read_text(blob_hash: str | None) -> str | None:
    if blob_hash is None:
        return None
    return _read(blob_hash, TEXT).decode("utf-8")
