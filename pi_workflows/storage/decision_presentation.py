"""A human decision's presentation and answers, checked before anything is stored
(reference decisions.md §1.3): the blocks a channel may show, within their limits, and a
response against the decision's choices. Nothing here reads or writes the database."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from ..canonical import canonical_json
from ..errors import InvalidInputError

PRESENTATION_SCHEMA = "pi-workflows.decision-presentation.v1"

# Presentation limits (reference decisions.md §1.3); exceeding one fails the node
# before the decision becomes pending.
MAX_PRESENTATION_CHARS = 64_000
MAX_BLOCKS = 256
MAX_BLOCK_ITEMS = 256
MAX_STRING_CHARS = 16_000
MAX_INPUT_CHARS = 4_000
BLOCK_TYPES = ("paragraph", "section", "bullets", "fields", "preformatted")
_SINGLE_LINE_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MULTI_LINE_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def checked_text(value: Any, where: str, *, multiline: bool = False) -> str:
    """`value` as a presentation text: a string, NFC, within the limit, no control
    characters (line breaks only in a `multiline` one)."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{where} must be a string.")
    text = unicodedata.normalize("NFC", value.replace("\r\n", "\n").replace("\r", "\n"))
    if not text.strip():
        raise InvalidInputError(f"{where} must not be empty.")
    if len(text) > MAX_STRING_CHARS:
        raise InvalidInputError(
            f"{where} has {len(text)} characters; the limit is {MAX_STRING_CHARS}."
        )
    pattern = _MULTI_LINE_CONTROL if multiline else _SINGLE_LINE_CONTROL
    if pattern.search(text):
        raise InvalidInputError(f"{where} contains control characters.")
    return text


def _items(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise InvalidInputError(f"{where} must be a non-empty list.")
    if len(value) > MAX_BLOCK_ITEMS:
        raise InvalidInputError(f"{where} has {len(value)} items; the limit is {MAX_BLOCK_ITEMS}.")
    return value


def _block(block: Any, index: int) -> dict[str, Any]:
    where = f"presentation block {index}"
    if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
        raise InvalidInputError(f"{where} must have a type among {', '.join(BLOCK_TYPES)}.")
    kind = block["type"]
    if kind in ("paragraph", "preformatted"):
        return {
            "type": kind,
            "text": checked_text(block.get("text"), f"{where} text", multiline=True),
        }
    if kind == "section":
        # Sections are titles; `text` is accepted as a synonym authors reach for.
        title = block.get("title", block.get("text"))
        return {"type": kind, "title": checked_text(title, f"{where} title")}
    items = _items(block.get("items"), f"{where} items")
    if kind == "bullets":
        return {
            "type": kind,
            "items": [checked_text(item, f"{where} item {i}") for i, item in enumerate(items)],
        }
    fields = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidInputError(f"{where} item {i} must be {{label, value}}.")
        fields.append(
            {
                "label": checked_text(item.get("label"), f"{where} item {i} label"),
                "value": checked_text(item.get("value"), f"{where} item {i} value", multiline=True),
            }
        )
    return {"type": kind, "items": fields}


def normalize_presentation(presentation: Any) -> dict[str, Any]:
    """The display allow-list of a decision: summary and typed blocks, nothing else."""
    if not isinstance(presentation, dict):
        raise InvalidInputError("A decision presentation must be an object.")
    blocks = presentation.get("blocks", [])
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        raise InvalidInputError(f"A decision presentation needs at most {MAX_BLOCKS} blocks.")
    normalized: dict[str, Any] = {
        "schema": PRESENTATION_SCHEMA,
        "blocks": [_block(block, i) for i, block in enumerate(blocks)],
    }
    if presentation.get("summary") is not None:
        normalized["summary"] = checked_text(
            presentation["summary"], "presentation summary", multiline=True
        )
    size = len(canonical_json(normalized))
    if size > MAX_PRESENTATION_CHARS:
        raise InvalidInputError(
            f"The decision presentation has {size} characters; the limit is "
            f"{MAX_PRESENTATION_CHARS}."
        )
    return normalized


def validate_response(choices: dict[str, Any], response: Any, where: str) -> dict[str, Any]:
    """`{"choice": k}` or `{"choice": k, "input": {name: text}}`, checked against the choices."""
    if not isinstance(response, dict) or set(response) - {"choice", "input"}:
        raise InvalidInputError(f"{where} must be {{choice, input?}}.")
    key = response.get("choice")
    if key not in choices:
        known = ", ".join(sorted(choices))
        raise InvalidInputError(f"{where}: {key!r} is not a choice; choose one of {known}.")
    spec = choices[key].get("input")
    given = response.get("input")
    if spec is None:
        if given is not None:
            raise InvalidInputError(f"{where}: choice {key!r} takes no input.")
        return {"choice": key}
    if not isinstance(given, dict) or set(given) != {spec["name"]}:
        raise InvalidInputError(
            f"{where}: choice {key!r} needs its text input {spec['name']!r} ({spec['prompt']})."
        )
    text = given[spec["name"]]
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_INPUT_CHARS:
        raise InvalidInputError(
            f"{where}: input {spec['name']!r} must be 1 to {MAX_INPUT_CHARS} characters."
        )
    return {"choice": key, "input": {spec["name"]: text}}
