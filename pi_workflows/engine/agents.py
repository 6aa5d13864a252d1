"""Agent steps (engine.md §4): tolerant output parsing, transcripts, executors.

The prompt a step's model gets comes from `piw_step_prompt` (built-in:
`pi_workflows.builtin.step_prompt`).

An interactive run asks its origin session through the store and waits; a headless run
hands the prompt to an agent executor registered with `piw_register_agent_executors`
(chosen by ``PI_WORKFLOWS_AGENT_EXECUTOR``, default ``command``). An executor is any
object with ``run_agent_step(request, signal) -> {"output": ...}``; the request
(`pi_workflows.records.AgentStepRequest`) also carries ``accept``, ``publish_update`` and an
`AgentTranscript` the engine stores with the attempt when it ends.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from typing import Any, Protocol

from .. import plugins, settings
from ..clock import now_ms
from ..errors import PiWorkflowsError
from ..records import AgentStepRequest, AgentStepResult
from .context import AbortSignal

MAX_PARSE_CANDIDATES = 64
_FENCED = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)
# A transcript keeps its first entries and its latest ones, each value cut to a readable
# size, and stays far below the worker protocol's 1 MiB frame.
TRANSCRIPT_HEAD_ENTRIES = 40
TRANSCRIPT_TAIL_ENTRIES = 160
TRANSCRIPT_VALUE_CHARS = 2000
TRANSCRIPT_MAX_BYTES = 256 * 1024
# While an attempt runs, its new entries are saved in chunks — the first as soon as there
# is one, then at most every two seconds, up to TRANSCRIPT_MAX_BYTES in all — so an attempt
# whose worker is stopped (cancel, pause) or dies keeps what the agent did until then.
TRANSCRIPT_SAVE_EVERY_SECONDS = 2.0


class AgentExecutorError(PiWorkflowsError):
    """No usable agent executor, or the executor failed."""


class AgentExecutor(Protocol):
    """The executor contract is documented at ``piw_register_agent_executors``."""

    def run_agent_step(self, request: AgentStepRequest, signal: AbortSignal) -> AgentStepResult:
        """Run one step; return ``{"output": <JSON or text>}``; stop when `signal` aborts."""


def _bounded(value: Any) -> Any:
    """`value` with long text cut, nested values longer than the limit as cut JSON text."""
    if isinstance(value, str):
        if len(value) <= TRANSCRIPT_VALUE_CHARS:
            return value
        cut = len(value) - TRANSCRIPT_VALUE_CHARS
        return f"{value[:TRANSCRIPT_VALUE_CHARS]}… [{cut} more characters]"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False, default=str)
        return json.loads(text) if len(text) <= TRANSCRIPT_VALUE_CHARS else _bounded(text)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _bounded(str(value))


class AgentTranscript:
    """What the agent did during one attempt, bounded; executors add, the engine stores.

    Entries are ``{"kind": ..., "at": <epoch ms>, **fields}`` with values cut to 2000
    characters. When there are too many (over 200, or over 256 KiB encoded), the first 40
    and the latest ones are kept and one ``{"kind": "omitted", "count": n}`` entry marks the
    gap. Thread-safe.
    """

    def __init__(self) -> None:
        self._head: list[dict[str, Any]] = []
        # (entry, encoded size, position in the order entries were added)
        self._tail: deque[tuple[dict[str, Any], int, int]] = deque()
        self._bytes = 0
        self._omitted = 0
        self._added = 0
        self._saved = 0
        self._saved_bytes = 0
        self._saved_at: float | None = None
        self._lock = threading.Lock()

    def add(self, kind: str, **fields: Any) -> None:
        entry = {"kind": kind, "at": now_ms(), **{k: _bounded(v) for k, v in fields.items()}}
        size = len(json.dumps(entry, ensure_ascii=False).encode())
        with self._lock:
            self._added += 1
            if len(self._head) < TRANSCRIPT_HEAD_ENTRIES:
                self._head.append(entry)
                self._bytes += size
                return
            self._tail.append((entry, size, self._added - 1))
            self._bytes += size
            while self._tail and (
                len(self._tail) > TRANSCRIPT_TAIL_ENTRIES or self._bytes > TRANSCRIPT_MAX_BYTES
            ):
                _, dropped, _ = self._tail.popleft()
                self._bytes -= dropped
                self._omitted += 1

    def unsaved_chunk(self, now: float) -> list[dict[str, Any]] | None:
        """The kept entries added since the last chunk, if one is due at monotonic `now`
        (see TRANSCRIPT_SAVE_EVERY_SECONDS); marks them saved."""
        with self._lock:
            if self._added == self._saved or self._saved_bytes >= TRANSCRIPT_MAX_BYTES:
                return None
            if self._saved_at is not None and now - self._saved_at < TRANSCRIPT_SAVE_EVERY_SECONDS:
                return None
            head = self._head[self._saved :] if self._saved < len(self._head) else []
            chunk = [*head, *(entry for entry, _, index in self._tail if index >= self._saved)]
            self._saved, self._saved_at = self._added, now
            self._saved_bytes += len(json.dumps(chunk, ensure_ascii=False).encode())
            return chunk or None

    def entries(self) -> list[dict[str, Any]]:
        """The kept entries in order, with the omission marker where entries were dropped."""
        with self._lock:
            gap = [{"kind": "omitted", "count": self._omitted}] if self._omitted else []
            return [*self._head, *gap, *(entry for entry, _, _ in self._tail)]


def _balanced_candidates(text: str) -> list[str]:
    """Balanced `{…}` / `[…]` spans, in order of their start, ignoring brackets in strings."""
    found: list[str] = []
    for start, opener in ((i, c) for i, c in enumerate(text) if c in "{["):
        closer = "}" if opener == "{" else "]"
        depth, in_string, escaped = 0, False, False
        for end in range(start, len(text)):
            char = text[end]
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
                continue
            if char == '"':
                in_string = True
            elif char == opener:
                depth += 1
            elif char == closer:
                depth -= 1
                if depth == 0:
                    found.append(text[start : end + 1])
                    break
        if len(found) >= MAX_PARSE_CANDIDATES:
            break
    return found


def parse_output(output: Any) -> Any:
    """Tolerant parse of a text output: JSON, a fenced JSON block, the first JSON span."""
    if not isinstance(output, str):
        return output
    candidates = [output.strip(), *(m.strip() for m in _FENCED.findall(output))]
    candidates += _balanced_candidates(output)
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return output


def headless_executor() -> AgentExecutor:
    name = settings.value("agent_executor")
    factories = plugins.agent_executor_factories()
    if name not in factories:
        known = ", ".join(sorted(factories)) or "none"
        raise AgentExecutorError(
            f"No agent executor named {name!r} (registered: {known}); set another with "
            "`pi-workflows config set agent_executor NAME`, then `pi-workflows host restart`."
        )
    return factories[name]()
