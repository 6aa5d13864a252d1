"""Content-addressed values: inputs, outputs, prompts, errors, message contents."""

from __future__ import annotations

import json
from typing import Any

from ..canonical import canonical_bytes, sha256_hex
from ..clock import now_ms
from ..errors import BlobConflictError
from . import statements

JSON = "application/json"
TEXT = "text/plain"


def _put(content: bytes, media_type: str) -> str:
    blob_hash = sha256_hex(content)
    # Content-addressed: insert, and only when the address was taken already compare
    # what is stored with what was asked for.
    if statements.insert_blob(blob_hash, media_type, content, now_ms()):
        return blob_hash
    stored = statements.select_blob(blob_hash)
    if stored != (media_type, len(content), content):
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
    stored = statements.select_blob(blob_hash)
    if stored is None:
        raise BlobConflictError(f"Blob {blob_hash[:12]} is missing from the state database.")
    if stored[0] != media_type:
        raise BlobConflictError(f"Blob {blob_hash[:12]} holds {stored[0]}, expected {media_type}.")
    return stored[2]


def read_json(blob_hash: str | None) -> Any:
    if blob_hash is None:
        return None
    return json.loads(_read(blob_hash, JSON))


def read_text(blob_hash: str | None) -> str | None:
    if blob_hash is None:
        return None
    return _read(blob_hash, TEXT).decode("utf-8")
