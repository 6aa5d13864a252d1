"""Content-addressed values: inputs, outputs, prompts, errors, message contents."""

from __future__ import annotations

import json
import threading
from collections.abc import Collection
from typing import Any

from ..canonical import canonical_bytes, sha256_hex
from ..clock import now_ms
from ..errors import BlobConflictError
from . import statements
from .models import JSON, SPLIT_PREFIX

TEXT = "text/plain"

#: A member of a split value at least this large is stored as a blob of its own.
PART_MIN_BYTES = 4 * 1024
#: How many levels of a split value are looked into for large members.
SPLIT_DEPTH = 4
_SKELETON = "$piw-skeleton"
_PARTS = "$piw-parts"


#: How many committed blob addresses are kept as hints before the hints start over.
STORED_HINTS = 8192
#: A new blob at most this large is inserted by a held write (PostgreSQL): the block's end
#: reads it back to check it. A larger one is inserted at once, and not read back.
HELD_INSERT_MAX_BYTES = 4 * 1024


class _Written(threading.local):
    """The blobs this thread's open `StateStore` transaction inserted or took up, in that
    order: hash -> media type (None: no transaction; an address is one row, so it has one
    media type).

    `StateStore` keeps it: empty when a transaction begins, cut back when a savepoint
    rolls back, None again when the transaction ends. A put that finds its blob here
    writes and reads nothing.

    `unchecked` holds the blobs the open block took up without reading them (stored
    already, by a commit of this process or by another writer): their rows are compared
    with what was asked for, and held, by one statement when the block ends
    (`check_taken_up`), rather than one statement each as they come. `outer` holds the
    unchecked blobs of the blocks around the open one, which their own ends check.
    """

    def __init__(self) -> None:
        self.blobs: dict[str, str] | None = None
        self.unchecked: dict[str, tuple[bytes, str, tuple[str, ...]]] = {}
        self.outer: list[dict[str, tuple[bytes, str, tuple[str, ...]]]] = []


_written = _Written()
# Addresses that commits made durable (hash -> media type): a hint, never trusted alone.
# A put of one reads the row to compare (so a corrupted blob is still caught) instead of
# inserting first, and inserts it when it is missing after all.
_committed: dict[str, str] = {}


def transaction_began() -> None:
    _written.blobs = {}
    _written.unchecked, _written.outer = {}, []


def block_began() -> None:
    """A savepoint opened: what it takes up is checked when it ends."""
    _written.outer.append(_written.unchecked)
    _written.unchecked = {}


def block_ended() -> None:
    """A savepoint ended (checked, or rolled back): the enclosing block's checks resume."""
    _written.unchecked = _written.outer.pop()


def written_mark() -> int:
    """Where a savepoint begins in the open transaction's written blobs."""
    return len(_written.blobs or ())


def rolled_back_to(mark: int) -> None:
    """A savepoint rolled back: the blobs written since `mark` are gone again."""
    blobs = _written.blobs
    while blobs and len(blobs) > mark:
        blobs.popitem()


def transaction_ended(committed: bool) -> None:
    blobs, _written.blobs = _written.blobs, None
    _written.unchecked, _written.outer = {}, []
    if committed and blobs:
        if len(_committed) + len(blobs) > STORED_HINTS:
            _committed.clear()
        _committed.update(blobs)


def _put(content: bytes, media_type: str, names: Collection[str] = ()) -> str:
    return _put_hashed(sha256_hex(content), content, media_type, names)


def _put_hashed(
    blob_hash: str, content: bytes, media_type: str, names: Collection[str] = ()
) -> str:
    """Store `content` (a value that names the blobs `names` by their address) unless it
    is stored already; returns its address."""
    written = _written.blobs
    if written is not None and written.get(blob_hash) == media_type:
        return blob_hash
    # Content-addressed: insert, and only when the address was taken already compare
    # what is stored with what was asked for (read first for an address seen stored).
    seen = _committed.get(blob_hash) == media_type
    if not seen:
        if _may_hold(blob_hash, content) and statements.insert_blobs_later(
            [(blob_hash, media_type, content)], now_ms()
        ):
            _insert_held(blob_hash, content, media_type, names)
            return blob_hash
        if statements.insert_blob(blob_hash, media_type, content, now_ms()):
            _inserted(blob_hash, content, media_type, names)
            return blob_hash
    _take_up(blob_hash, content, media_type, names)
    return blob_hash


def _may_hold(blob_hash: str, content: bytes) -> bool:
    """An insert may be held: a small blob this transaction has not written (one it
    holds under another media type is a conflict found at once, `_take_up`)."""
    written = _written.blobs
    return (
        written is not None and blob_hash not in written and len(content) <= HELD_INSERT_MAX_BYTES
    )


def _inserted(blob_hash: str, content: bytes, media_type: str, names: Collection[str]) -> None:
    """A blob row this transaction inserted: the blobs its content names are recorded with
    it (`NestedBlob`). A row stored already has its names recorded: they follow from its
    content, and every writer of a value that names blobs says so."""
    _note_written(blob_hash, media_type)
    _record_nested(blob_hash, content, media_type, names)


def _record_nested(blob_hash: str, content: bytes, media_type: str, names: Collection[str]) -> None:
    nested = set(names)
    if media_type == JSON and content.startswith(SPLIT_PREFIX):
        nested |= split_part_hashes(content)
    if nested:
        statements.insert_nested(blob_hash, sorted(nested))


def _insert_held(blob_hash: str, content: bytes, media_type: str, names: Collection[str]) -> None:
    """A blob whose insert travels with the transaction's next statement: whether it
    found the address taken is not known, so its row is checked with the blobs the block
    took up (`check_taken_up`), which reads it after the insert. Its nested blobs are
    recorded either way: for a row stored already, those rows exist and the insert of
    each does nothing."""
    _record_nested(blob_hash, content, media_type, names)
    _written.unchecked[blob_hash] = (content, media_type, tuple(names))
    _note_written(blob_hash, media_type)


def _take_up(blob_hash: str, content: bytes, media_type: str, names: Collection[str] = ()) -> None:
    """Reference a blob stored already. Inside a transaction its row is compared (and
    held) when the open block ends, together with the others it took up: the
    transaction's own writes do not read the blob, and none of them commits before that
    check. An address this transaction holds under another media type is a conflict
    found at once."""
    written = _written.blobs
    if written is None or blob_hash in written:
        _reuse(blob_hash, content, media_type, names)
        return
    _written.unchecked[blob_hash] = (content, media_type, tuple(names))
    _note_written(blob_hash, media_type)


def check_taken_up() -> None:
    """Compare with what was asked for, and hold until the transaction ends, the rows of
    the blobs the open block took up, in one statement; a row a prune deleted since it
    was seen is inserted again (`_reuse`). Raises `BlobConflictError` for a row that
    differs: the block then fails before anything of it commits."""
    taken_up = take_unchecked()
    if taken_up:
        check_read(taken_up, statements.select_blobs(list(taken_up), reuse=True))


def take_unchecked() -> dict[str, tuple[bytes, str, tuple[str, ...]]]:
    """The blobs the open block took up and nobody checked yet, for a caller that reads
    their rows with a read of its own (the end of a transaction: `statements.commit_rows`)
    and then hands them to `check_read`."""
    taken_up, _written.unchecked = _written.unchecked, {}
    return taken_up


def check_read(
    taken_up: dict[str, tuple[bytes, str, tuple[str, ...]]],
    stored: dict[str, tuple[str, int, bytes]],
) -> None:
    """`check_taken_up` of the blobs `take_unchecked` gave, whose rows (read holding them)
    are `stored`."""
    for blob_hash, (content, media_type, names) in taken_up.items():
        found = stored.get(blob_hash)
        if found is None:
            _reuse(blob_hash, content, media_type, names)
        else:
            _check_stored(blob_hash, found, media_type, content)


def _settle(blob_hash: str) -> None:
    """Check a taken-up blob now, before it is read (a prune may have deleted it). An
    enclosing block's entry stays for its own end too: this block may still roll back."""
    for block in (_written.unchecked, *reversed(_written.outer)):
        taken = block.get(blob_hash)
        if taken is not None:
            if block is _written.unchecked:
                del block[blob_hash]
            content, media_type, names = taken
            _reuse(blob_hash, content, media_type, names)
            return


def _reuse(blob_hash: str, content: bytes, media_type: str, names: Collection[str] = ()) -> None:
    """Take up a blob stored already: compare it with what was asked for and hold its row
    until the transaction ends, so a prune cannot delete it before this transaction's
    reference to it commits (`retention` skips a held blob).

    A prune may have deleted it since it was seen (or since the insert found it taken):
    then it is inserted again. Each turn finds the row gone because a prune deleted it,
    and a prune deletes only a blob that is not held, so this ends.
    """
    while (stored := statements.select_blob(blob_hash, reuse=True)) is None:
        if statements.insert_blob(blob_hash, media_type, content, now_ms()):
            _inserted(blob_hash, content, media_type, names)
            return
    _check_stored(blob_hash, stored, media_type, content)


def _check_stored(
    blob_hash: str, stored: tuple[str, int, bytes] | None, media_type: str, content: bytes
) -> None:
    if stored != (media_type, len(content), content):
        raise BlobConflictError(
            f"Content-addressed blob conflict for {blob_hash[:12]}: the stored value differs "
            "from its address; run 'pi-workflows state verify' and restore from a backup."
        )
    _note_written(blob_hash, media_type)


def _note_written(blob_hash: str, media_type: str) -> None:
    if _written.blobs is not None:
        _written.blobs[blob_hash] = media_type


def _put_together(contents: list[bytes], media_type: str) -> list[str]:
    """`_put` of each; those neither written by this transaction nor seen stored before
    are inserted by one statement."""
    hashes = [sha256_hex(content) for content in contents]
    written = _written.blobs or {}
    fresh: dict[str, bytes] = {}
    for blob_hash, content in zip(hashes, contents, strict=True):
        if written.get(blob_hash) == media_type or blob_hash in fresh:
            continue
        if _committed.get(blob_hash) == media_type:
            _put_hashed(blob_hash, content, media_type)
        else:
            fresh[blob_hash] = content
    if len(fresh) > 1:
        rows = [(blob_hash, media_type, content) for blob_hash, content in fresh.items()]
        if all(_may_hold(h, c) for h, c in fresh.items()) and statements.insert_blobs_later(
            rows, now_ms()
        ):
            for blob_hash, content in fresh.items():
                _insert_held(blob_hash, content, media_type, ())
            return hashes
        new = statements.insert_blobs(rows, now_ms())
        for blob_hash, content in fresh.items():
            if blob_hash in new:
                _inserted(blob_hash, content, media_type, ())
            else:
                _take_up(blob_hash, content, media_type)
    else:
        for blob_hash, content in fresh.items():
            _put_hashed(blob_hash, content, media_type)
    return hashes


def _json_content(value: Any) -> bytes:
    """What `put_json` stores for `value`."""
    if _is_split_form(value):  # would read back as a split value: store it as one part
        return canonical_bytes({_SKELETON: None, _PARTS: [[[], _put_part(value)]]})
    return canonical_bytes(value)


def put_json(value: Any, names: Collection[str] = ()) -> str:
    """Store a JSON value by the sha256 of its canonical bytes; returns the hash. A value
    that names other blobs by their address (`names`) keeps them while it is kept."""
    return put_json_stored(value, names)[0]


def put_json_stored(value: Any, names: Collection[str] = ()) -> tuple[str, bytes]:
    """`put_json`, with the bytes it stored (what a read of the blob's row finds)."""
    content = _json_content(value)
    return _put(content, JSON, names), content


def _in_parts_content(value: Any) -> bytes:
    """What `put_json_in_parts` stores for `value` (its large members stored already)."""
    if _is_split_form(value):
        return _json_content(value)
    whole = canonical_bytes(value)
    if len(whole) < PART_MIN_BYTES or not isinstance(value, dict):
        return whole  # encoded once: this is every durable boundary's path
    splitter = _Splitter()
    skeleton = splitter.split(value, [], SPLIT_DEPTH)
    return canonical_bytes({_SKELETON: skeleton, _PARTS: splitter.parts})


def put_json_in_parts(value: Any) -> str:
    """Store a JSON object with each large member in a blob of its own; `read_json` reads
    it back whole.

    A run's snapshots repeat every earlier result, and its events and worker replies
    quote them: stored whole, a run with megabytes of results would store them again at
    every step. Split, each large member is stored once by its address however many
    values carry it. Small values are stored whole, exactly as `put_json` does.
    """
    return _put(_in_parts_content(value), JSON)


def put_json_in_parts_together(values: list[Any]) -> list[str]:
    """`put_json_in_parts` of each value, their new blobs inserted by one statement (a
    snapshot and its event are written together at every durable boundary)."""
    return _put_together([_in_parts_content(value) for value in values], JSON)


class _Splitter:
    """One value's split: its parts, and each member's canonical bytes encoded once.

    Whether a member is large is asked of it by its parent (is any child large?) and by
    itself, and a large one is then stored: without the memo a 2 MiB state was encoded
    three times over at each of its levels. The members are alive for the whole split, so
    their ids are stable keys.
    """

    def __init__(self) -> None:
        self.parts: list[list[Any]] = []
        self._encoded: dict[int, bytes] = {}

    def split(self, value: dict[str, Any] | list[Any], path: list[str | int], depth: int) -> Any:
        if isinstance(value, dict):
            return {key: self._member(item, [*path, key], depth) for key, item in value.items()}
        return [self._member(item, [*path, index], depth) for index, item in enumerate(value)]

    def _member(self, item: Any, path: list[str | int], depth: int) -> Any:
        if not self._is_large(item):
            return item
        children = item.values() if isinstance(item, dict) else item
        if depth > 1 and isinstance(item, dict | list) and any(map(self._is_large, children)):
            return self.split(item, path, depth - 1)
        self.parts.append([path, _put(self._canonical(item), JSON)])
        return None

    def _is_large(self, value: Any) -> bool:
        if not isinstance(value, dict | list | str):
            return False
        return len(self._canonical(value)) >= PART_MIN_BYTES

    def _canonical(self, value: Any) -> bytes:
        encoded = self._encoded.get(id(value))
        if encoded is None:
            encoded = self._encoded[id(value)] = canonical_bytes(value)
        return encoded


def _put_part(value: Any) -> str:
    """A part is stored as plain canonical JSON and read back as is, never joined."""
    return _put(canonical_bytes(value), JSON)


def _is_split_form(value: Any) -> bool:
    return isinstance(value, dict) and value.keys() == {_SKELETON, _PARTS}


def split_part_hashes(content: bytes) -> set[str]:
    """The parts a stored split value (its bytes begin with `SPLIT_PREFIX`) references."""
    return {part_hash for _, part_hash in json.loads(content)[_PARTS]}


def _joined(split: dict[str, Any]) -> Any:
    whole = split[_SKELETON]
    for path, part_hash in split[_PARTS]:
        part = json.loads(_read(part_hash, JSON))
        if not path:
            return part
        parent = whole
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = part
    return whole


def put_text(text: str) -> str:
    return _put(text.encode("utf-8"), TEXT)


def _read(blob_hash: str, media_type: str) -> bytes:
    if _written.blobs is not None:
        _settle(blob_hash)
    stored = statements.select_blob(blob_hash)
    if stored is None:
        raise BlobConflictError(f"Blob {blob_hash[:12]} is missing from the state database.")
    if stored[0] != media_type:
        raise BlobConflictError(f"Blob {blob_hash[:12]} holds {stored[0]}, expected {media_type}.")
    return stored[2]


def read_json(blob_hash: str | None) -> Any:
    """The value stored by `put_json` or `put_json_in_parts`."""
    if blob_hash is None:
        return None
    value = json.loads(_read(blob_hash, JSON))
    return _joined(value) if _is_split_form(value) else value


def read_json_joined(blob_hash: str | None, media_type: str | None, content: Any) -> Any:
    """`read_json(blob_hash)` from the blob's media type and content, read with the row
    that names it (a LEFT JOIN's columns). Inside a transaction (whose blobs may still
    wait to be checked), or when the row was missing or is not JSON, `read_json` reads
    it again itself and checks, or fails."""
    if blob_hash is None:
        return None
    if _written.blobs is not None or content is None or media_type != JSON:
        return read_json(blob_hash)
    value = json.loads(bytes(content))
    return _joined(value) if _is_split_form(value) else value


def read_text(blob_hash: str | None) -> str | None:
    if blob_hash is None:
        return None
    return _read(blob_hash, TEXT).decode("utf-8")
