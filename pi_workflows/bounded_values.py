"""Large values cut to a preview where a model or a view quotes them (reference 8.7, 11.13).

A terminal message or a session view quotes a run's input and results; a 512 KiB result
would crowd out the model's context and push a view past the 1 MiB protocol frame. Such
a value is replaced by its canonical JSON cut to `QUOTED_VALUE_BYTES`, ending with a
marker that says where the whole value is (`pi-workflows run status`). Small values are
left exactly as they are.
"""

from __future__ import annotations

from typing import Any

from .canonical import canonical_json
from .records import TerminalFacts

QUOTED_VALUE_BYTES = 8 * 1024


def truncation_marker(what: str) -> str:
    return f"[{what} truncated; inspect workflow status for the complete {what}]"


def quoted(
    value: Any, what: str, limit: int = QUOTED_VALUE_BYTES, marker: str | None = None
) -> Any:
    """`value`, or when its canonical JSON is over `limit` bytes, a cut text of it ending
    with `marker` (default: where the complete `what` is)."""
    text = value if isinstance(value, str) else canonical_json(value)
    data = text.encode("utf-8")
    if len(data) <= limit:
        return value
    preview = data[:limit].decode("utf-8", errors="ignore")
    return f"{preview}… {marker or truncation_marker(what)}"


def bounded_terminal_facts(facts: TerminalFacts) -> TerminalFacts:
    """The facts with the input, results and errors (earlier outcomes' too) cut; keys that
    the facts do not have stay absent."""
    bounded: dict[str, Any] = dict(facts)
    for key, what in (("input", "input"), ("finalOutput", "result"), ("error", "error")):
        if key in bounded:
            bounded[key] = quoted(bounded[key], what)
    if "earlierOutcomes" in facts:
        bounded["earlierOutcomes"] = [
            {
                **outcome,
                "finalOutput": quoted(outcome.get("finalOutput"), "result"),
                "error": quoted(outcome.get("error"), "error"),
            }
            for outcome in facts["earlierOutcomes"]
        ]
    return bounded  # type: ignore[return-value]
