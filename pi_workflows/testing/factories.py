"""Record factories: hook arguments with sensible defaults; pass only what your test is about.

Each factory returns the same type the host hands a hook, so a plugin tested with them sees
what it will see in production.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..records import (
    AnswerResult,
    ChannelContext,
    ChannelSettings,
    Claim,
    HostInfo,
    RunRecord,
    TerminalFacts,
    TurnReport,
)
from ..storage.terminal_facts import TERMINAL_RESULT_SCHEMA, terminal_fingerprint


def run_record(**overrides: Any) -> RunRecord:
    """A queued interactive run of ``hello`` (``run_id="run-1"``); override any field."""
    fields: dict[str, Any] = {
        "run_id": "run-1",
        "workflow_name": "hello",
        "status": "queued",
        "queue_status": "queued",
        "execution_mode": "interactive",
        "origin_session_id": "session-1",
        "parent_run_id": None,
        "lineage_kind": None,
        "restart_number": 0,
        "input": {"task": "x"},
        "launch_options": {},
        "available_at": 100,
        "created_at": 100,
        "revision": 1,
    }
    fields.update(overrides)
    return RunRecord(**fields)


def host_info(**overrides: Any) -> HostInfo:
    """An idle host (``host-a``, epoch 1, 0 of 4 workers); override any field."""
    fields: dict[str, Any] = {
        "host_id": "host-a",
        "epoch": 1,
        "active_workers": 0,
        "max_workers": 4,
    }
    fields.update(overrides)
    return HostInfo(**fields)


def claim(**overrides: Any) -> Claim:
    """A first-generation claim of ``run-1`` by ``host-a``; override any field."""
    fields: dict[str, Any] = {
        "run_id": "run-1",
        "owner_id": "host-a",
        "generation": 1,
        "expires_at": 60_000,
    }
    fields.update(overrides)
    return Claim(**fields)


def terminal_facts(
    status: str = "completed", *, fingerprint: bool = True, **overrides: Any
) -> TerminalFacts:
    """Terminal facts (``pi-workflows.terminal-result.v1``) of a ``hello`` run.

    A completed run has ``finalOutput``; any other status an ``error``. With `fingerprint`
    (what ``piw_render_terminal_message`` gets) ``terminalFingerprint`` is computed as the
    host computes it; without (what ``piw_presentation_instructions`` gets) it is absent.
    """
    completed = status == "completed"
    facts: TerminalFacts = {
        "schema": TERMINAL_RESULT_SCHEMA,
        "runId": "run-1",
        "workflowName": "hello",
        "workflowRef": "hello",
        "input": {"name": "Ada"},
        "status": status,
        "finalOutput": {"greeting": "Hello, Ada!"} if completed else None,
        "error": None if completed else "Node 'greet' failed: RuntimeError: boom",
        "reason": None,
        "restartNumber": 0,
        "earlierOutcomes": [],
    }
    facts.update(overrides)  # type: ignore[typeddict-item]
    if fingerprint:
        facts["terminalFingerprint"] = terminal_fingerprint(facts)
    return facts


def turn_report(state: str = "end", **overrides: Any) -> TurnReport:
    """A ``workflowTurn.report`` of turn ``turn-1`` for message ``msg-1`` of ``run-1``.

    An ``end`` report stops with ``stop_reason="stop"`` unless overridden.
    """
    fields: dict[str, Any] = {
        "state": state,
        "workflow_turn_id": "turn-1",
        "workflow_message_id": "msg-1",
        "run_id": "run-1",
        "target_session_id": "session-1",
        "coordinator_epoch": "epoch-1",
        "stop_reason": "stop" if state == "end" else None,
    }
    fields.update(overrides)
    return TurnReport(**fields)


@dataclass
class AnswerRecorder:
    """Stands in for the host's ``report_answer``: keeps every answer, returns `outcome`.

    ``answers`` holds ``(decision_id, choice, input, actor)`` tuples in call order.
    """

    outcome: str = "accepted"
    answers: list[tuple[str, str, Any, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(
        self, decision_id: str, choice: str, input: Any = None, *, actor: str
    ) -> AnswerResult:
        with self._lock:
            self.answers.append((decision_id, choice, input, actor))
        won = self.outcome in ("accepted", "adopted")
        return {
            "outcome": self.outcome,
            "receipt": {"decisionId": decision_id, "winner": {"choice": choice}} if won else None,
            "error": None if won else f"The answer was {self.outcome}.",
        }


def channel_context(
    name: str = "test-channel",
    *,
    kind: str | None = None,
    options: Mapping[str, Any] | None = None,
    credentials: Mapping[str, str] | None = None,
    allowed_actors: tuple[str, ...] | None = None,
    report_answer: Callable[..., AnswerResult] | None = None,
    store_call: Callable[[Callable[[], Any]], Any] | None = None,
) -> ChannelContext:
    """The context a decision channel factory gets, without a host.

    ``report_answer`` defaults to a fresh :class:`AnswerRecorder` (reach it as
    ``context.report_answer``); ``store_call`` defaults to calling the function directly.
    """
    settings = ChannelSettings(
        name,
        kind or name,
        allowed_actors,
        dict(options or {}),
        dict(credentials or {}),
    )
    return ChannelContext(
        settings,
        report_answer if report_answer is not None else AnswerRecorder(),
        store_call if store_call is not None else (lambda function: function()),
    )
