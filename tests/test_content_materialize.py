"""The client's checks when it reads back a content reference (reference 3.18)."""

from __future__ import annotations

import base64
import hashlib

import pytest

from pi_workflows.canonical import canonical_json
from pi_workflows.client.content import ContentError, materialize

VALUE = {"rows": ["x" * 100] * 50}
DATA = canonical_json(VALUE).encode()
REFERENCE = {"$content": {"sha256": hashlib.sha256(DATA).hexdigest(), "bytes": len(DATA)}}


def _reader(data: bytes, chunk: int = 1000, offset_shift: int = 0):
    def read(sha256: str, size: int, offset: int) -> dict:
        part = data[offset : offset + chunk]
        return {
            "sha256": sha256,
            "offset": offset + offset_shift,
            "chunk": base64.b64encode(part).decode(),
            "nextOffset": offset + offset_shift + len(part),
        }

    return read


def test_chunks_are_put_back_where_the_reference_was():
    assert materialize({"a": [1, REFERENCE]}, _reader(DATA)) == {"a": [1, VALUE]}


@pytest.mark.scenario("3.18")
def test_a_chunk_out_of_place_or_changed_content_is_refused():
    with pytest.raises(ContentError, match="chunk of content .* is invalid"):
        materialize(REFERENCE, _reader(DATA, offset_shift=1))
    changed = DATA.replace(b"x", b"y", 1)
    with pytest.raises(ContentError, match="does not match its sha256"):
        materialize(REFERENCE, _reader(changed))
    longer = DATA + b" "
    with pytest.raises(ContentError, match="chunk of content .* is invalid"):
        materialize(REFERENCE, _reader(longer, chunk=len(longer)))
