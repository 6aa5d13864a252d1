"""Keeping content references apart from user values in client answers (SPEC §8).

An answer too big for one frame carries some of its values as
``{"$content": {"sha256", "bytes"}}`` references. A workflow may return any JSON, so a
value of its own could look like a reference; the host therefore wraps every object of an
answer that has a ``$content`` or ``$escaped`` key of its own as ``{"$escaped": object}``
(reference engine.md §8.2 does the same for ``$artifact``), and the client unwraps it.
An unwrapped ``$content`` object is then always a reference, and a user value that looks
like the wrapper itself round-trips as well.
"""

from __future__ import annotations

from typing import Any

CONTENT_KEY = "$content"
ESCAPE_KEY = "$escaped"
_RESERVED = (CONTENT_KEY, ESCAPE_KEY)
# What a canonical frame holds when any object in it uses a reserved key (canonical JSON
# never escapes `$`), so the common answer is searched once and not walked.
RESERVED_KEY_MARKERS = tuple(f'"{key}":'.encode() for key in _RESERVED)


def escape_user_values(value: Any) -> Any:
    """`value` with every object that has a reserved key wrapped (the same value when none
    has one; `value` itself is never changed)."""
    if isinstance(value, dict):
        children = {key: escape_user_values(child) for key, child in value.items()}
        if any(children[key] is not value[key] for key in value):
            escaped = children
        else:
            escaped = value
        if any(key in value for key in _RESERVED):
            return {ESCAPE_KEY: escaped}
        return escaped
    if isinstance(value, list):
        items = [escape_user_values(item) for item in value]
        if any(new is not old for new, old in zip(items, value, strict=True)):
            return items
        return value
    return value
