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
import os
import re
import threading
from collections import deque
from typing import Any, Protocol

from .. import plugins
from ..clock import now_ms
from ..errors import PiWorkflowsError
from ..records import AgentStepRequest, AgentStepResult
from .context import AbortSignal

EXECUTOR_ENV = "PI_WORKFLOWS_AGENT_EXECUTOR"
DEFAULT_EXECUTOR = "command"
MAX_PARSE_CANDIDATES = 64
_FENCED = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)
# A transcript keeps its first entries and its latest ones, each value cut to a readable
# size, and stays far below the worker protocol's 1 MiB frame.
TRANSCRIPT_HEAD_ENTRIES = 40
TRANSCRIPT_TAIL_ENTRIES = 160
TRANSCRIPT_VALUE_CHARS = 2000
TRANSCRIPT_MAX_BYTES = 256 * 1024


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
        self._tail: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self._omitted = 0
        self._lock = threading.Lock()

    def add(self, kind: str, **fields: Any) -> None:
        entry = {"kind": kind, "at": now_ms(), **{k: _bounded(v) for k, v in fields.items()}}
        size = len(json.dumps(entry, ensure_ascii=False).encode())
        with self._lock:
            if len(self._head) < TRANSCRIPT_HEAD_ENTRIES:
                self._head.append(entry)
                self._bytes += size
                return
            self._tail.append((entry, size))
            self._bytes += size
            while self._tail and (
                len(self._tail) > TRANSCRIPT_TAIL_ENTRIES or self._bytes > TRANSCRIPT_MAX_BYTES
            ):
                _, dropped = self._tail.popleft()
                self._bytes -= dropped
                self._omitted += 1

    def entries(self) -> list[dict[str, Any]]:
        """The kept entries in order, with the omission marker where entries were dropped."""
        with self._lock:
            gap = [{"kind": "omitted", "count": self._omitted}] if self._omitted else []
            return [*self._head, *gap, *(entry for entry, _ in self._tail)]


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
    name = os.environ.get(EXECUTOR_ENV, DEFAULT_EXECUTOR)
    factories = plugins.agent_executor_factories()
    if name not in factories:
        known = ", ".join(sorted(factories)) or "none"
        raise AgentExecutorError(
            f"No agent executor named {name!r} (registered: {known}); set {EXECUTOR_ENV}."
        )
    return factories[name]()
