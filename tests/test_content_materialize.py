"""The client's checks when it reads back a content reference (reference 3.18), and user
values that look like references (reference 4.23, issue 22.4)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pi_workflows.canonical import canonical_json
from pi_workflows.client.content import ContentError, materialize
from pi_workflows.host.content_references import HeldContent, frame_within_limit
from pi_workflows.protocol.content_values import escape_user_values
from pi_workflows.protocol.framing import MAX_FRAME_BYTES

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
    with pytest.raises(ContentError, match="does not match its size"):
        materialize(REFERENCE, _reader(longer, chunk=len(longer)))


def test_a_wrong_digest_in_a_chunk_is_refused():
    def other_digest(sha256: str, size: int, offset: int) -> dict:
        return {**_reader(DATA)(sha256, size, offset), "sha256": "f" * 64}

    with pytest.raises(ContentError, match="chunk of content .* is invalid"):
        materialize(REFERENCE, other_digest)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["$content", "$escaped", "sha256", "bytes", "a"]), children
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_any_user_value_round_trips_through_the_escape(value):
    assert materialize(escape_user_values(value), _refuse_reads) == value


def _refuse_reads(sha256: str, size: int, offset: int) -> dict:
    raise AssertionError("a user value was read as a content reference")


def _held_reader(held: HeldContent):
    return lambda sha256, size, offset: held.read(
        {"sha256": sha256, "bytes": size, "offset": offset}
    )


@pytest.mark.scenario("4.23")
def test_an_answer_over_a_frame_keeps_user_values_that_look_like_references():
    """The host's frame with references and wrapped user values, read back by the client."""
    lookalike = {"$content": {"sha256": "0" * 64, "bytes": 5}}
    receipt = {
        "small": lookalike,
        "inside": {"$content": ["y" * 100] * 300},  # the wrapped object's value is moved
        # 1.2 MB of wrapped objects with no part over 16 KiB: wrappers are moved whole
        "wholes": [{"$escaped": "z" * 10000, "b": "z" * 10000, "n": n} for n in range(60)],
    }
    held = HeldContent()
    frame = frame_within_limit({"type": "response", "receipt": receipt}, held)
    assert len(frame) <= MAX_FRAME_BYTES
    sent = json.loads(frame)["receipt"]
    assert sent["small"] == {"$escaped": lookalike}
    assert set(sent["inside"]["$escaped"]["$content"]) == {"$content"}
    assert any(set(whole) == {"$content"} for whole in sent["wholes"])
    assert materialize(sent, _held_reader(held)) == receipt
