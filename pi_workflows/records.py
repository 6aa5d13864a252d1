"""Value records that cross module and plugin boundaries.

Hooks receive and return these instead of peewee rows, so a plugin never holds a live
database object and the core can add fields without breaking signatures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class HostInfo:
    """The host asking a claiming hook, and its current load."""

    host_id: str
    epoch: int
    active_workers: int
    max_workers: int


@dataclass(frozen=True)
class RunRecord:
    """A run joined with its queue row, as the host sees it when deciding about it."""

    run_id: str
    workflow_name: str
    status: str
    queue_status: str
    execution_mode: str
    origin_session_id: str | None
    parent_run_id: str | None
    lineage_kind: str | None
    restart_number: int
    input: Any
    launch_options: dict[str, Any]
    available_at: int
    created_at: int
    revision: int
    paused: bool = False
    error_code: str | None = None
    presentation_prompt: str | None = None

    @property
    def is_initialized(self) -> bool:
        """A run that has started executing resumes instead of starting again."""
        return self.status != "queued"


@dataclass(frozen=True)
class Claim:
    """A fenced claim on a run: owner, generation and expiry (the token stays in the host)."""

    run_id: str
    owner_id: str
    generation: int
    expires_at: int


@dataclass(frozen=True)
class WorkerRunCommand:
    """What a freshly started worker does with its run (SPEC §7.3).

    `kind` is one of `start`, `resume`, `restart`, `continue`.
    """

    kind: str
    input: Any = None
    parent_run_id: str | None = None
    human_decision: dict[str, Any] | None = None
    resume_interaction_attempt_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"kind": self.kind}
        if self.kind in ("start", "restart", "continue"):
            payload["input"] = self.input
        if self.parent_run_id is not None:
            payload["parentRunId"] = self.parent_run_id
        if self.human_decision is not None:
            payload["humanDecision"] = self.human_decision
        if self.resume_interaction_attempt_id is not None:
            payload["resumeInteractionAttemptId"] = self.resume_interaction_attempt_id
        return payload


@dataclass(frozen=True)
class WorkerSettings:
    """Host settings a worker launch may depend on."""

    home: Path
    database_url: str | None
    python: str


@dataclass(frozen=True)
class WorkerProcessSpec:
    """How to start a worker process: argv, extra environment and working directory.

    `forkable` says the launch is the built-in worker command, so the host may fork it
    from its worker fork server (imports already done) instead of spawning a cold one.
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    forkable: bool = False


@dataclass(frozen=True)
class TurnReport:
    """A session's `workflowTurn.report` payload (SPEC §9.4)."""

    state: str
    workflow_turn_id: str
    workflow_message_id: str
    run_id: str
    target_session_id: str
    coordinator_epoch: str
    stop_reason: str | None = None
    response_session_entry_id: str | None = None


@dataclass(frozen=True)
class TurnReceipt:
    """The adjudicated answer to a turn report: outcome, ownership and the saved turn."""

    outcome: str
    ownership: str
    turn: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "pi-workflows.workflow-turn-report-receipt.v1",
            "ownership": self.ownership,
            "turn": self.turn,
        }


@dataclass(frozen=True)
class MessageContent:
    """The text a session shows for a workflow message, plus structured details."""

    text: str
    details: dict[str, Any] = field(default_factory=dict)
