"""The documented limits on values a run carries (docs/operations.md, "Limits").

Checked at the door: the CLI before it sends, the host at `run.start` and
`checkpoint.answer`, the engine when a node completes. A value over a limit is one clear
error naming the limit, never a crash loop further down.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .canonical import canonical_json
from .errors import InvalidInputError

MAX_INPUT_BYTES = 512 * 1024  # a run's input or a checkpoint answer, as canonical JSON
MAX_OUTPUT_BYTES = 512 * 1024  # one node's output (and so a run's final output)
MAX_JSON_DEPTH = 64  # nesting of arrays and objects
# An agent step's whole prompt: its step message must fit one 1 MiB client frame.
MAX_PROMPT_BYTES = 512 * 1024


def json_depth(value: Any, stop_after: int = MAX_JSON_DEPTH) -> int:
    """How deeply `value` nests (a scalar is 0); counting stops past `stop_after`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def checked_json(value: Any, what: str, max_bytes: int) -> str:
    """The canonical JSON of `value`, or an `InvalidInputError` naming the broken limit."""
    depth = json_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise InvalidInputError(
            f"{what} is nested more than {MAX_JSON_DEPTH} levels deep; flatten it."
        )
    try:
        text = canonical_json(value)
    except ValueError:
        raise InvalidInputError(
            f"{what} contains NaN or Infinity, which JSON does not allow; use null or a string."
        ) from None
    except TypeError:
        raise InvalidInputError(f"{what} is not a JSON value: {value!r:.200}") from None
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInputError(
            f"{what} is {human_size(size)}; the limit is {human_size(max_bytes)}. Pass large "
            "data as a file path instead."
        )
    return text


def human_size(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"


def checked_prompt(prompt: str, node_id: str) -> str:
    """`prompt`, or an `InvalidInputError` when it is over `MAX_PROMPT_BYTES`."""
    size = len(prompt.encode("utf-8"))
    if size > MAX_PROMPT_BYTES:
        raise InvalidInputError(
            f"The prompt of node {node_id!r} is {human_size(size)}; the limit is "
            f"{human_size(MAX_PROMPT_BYTES)}. Quote less of earlier results in it, or pass "
            "them as a file path."
        )
    return prompt
