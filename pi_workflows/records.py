"""Value records that cross module and plugin boundaries.

Hooks receive and return these instead of peewee rows, so a plugin never holds a live
database object and the core can add fields without breaking signatures.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict


@dataclass(frozen=True)
class HostInfo:
    """The host asking a claiming hook, and its current load."""

    #: this host process's id (new at every start).
    host_id: str
    #: the host epoch it holds: one host per home runs at a time, each with a higher epoch.
    epoch: int
    #: workers running or starting now.
    active_workers: int
    #: ``PI_WORKFLOWS_MAX_WORKERS`` (default 4).
    max_workers: int


@dataclass(frozen=True)
class RunRecord:
    """A run joined with its queue row, as the host sees it when deciding about it.

    ``paused``: an operator paused it (``run pause``); ``error_code``: the queue's error
    code of a failed launch or run, else None; ``presentation_prompt``: the workflow's
    instructions for presenting its result, else None.
    """

    run_id: str
    workflow_name: str
    #: ``queued``, ``running``, ``waiting``, ``completed``, ``failed``, ``timed_out`` or
    #: ``cancelled`` (what the run did).
    status: str
    #: ``queued``, ``starting``, ``running``, ``parked``, ``done``, ``failed`` or
    #: ``cancelled`` (where the run is in the host's queue).
    queue_status: str
    #: ``interactive`` (agent steps go to the origin session) or ``headless`` (executor).
    execution_mode: str
    #: the chat session that started an interactive run, else None.
    origin_session_id: str | None
    #: the run this one restarts or continues, else None.
    parent_run_id: str | None
    #: ``restart`` or ``continuation`` for a run with a parent, else None.
    lineage_kind: str | None
    #: 0 for a first run, n for the n-th restart in its chain.
    restart_number: int
    #: the run's input (JSON).
    input: Any
    #: start options kept with the run (a continuation's ``humanDecision``, say).
    launch_options: dict[str, Any]
    #: epoch ms from which the run may be claimed.
    available_at: int
    #: epoch ms.
    created_at: int
    #: bumped by every committed change of the run.
    revision: int
    paused: bool = False
    error_code: str | None = None
    presentation_prompt: str | None = None
    priority: int = 0  # claimed before lower priorities, whatever their age

    @property
    def is_initialized(self) -> bool:
        """A run that has started executing resumes instead of starting again."""
        return self.status != "queued"


class _DecodedOnFirstRead:
    """A `RunRecord` field that `stored_run_record` left encoded: decoded the first time it
    is read, then held by the record like any other field.

    A non-data descriptor: a record made by its constructor holds every value in its own
    ``__dict__``, which Python reads before asking the descriptor.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, record: Any, owner: type | None = None) -> Any:
        if record is None:
            return self
        decode, encoded = record.__dict__["_encoded"][self.name]
        value = record.__dict__[self.name] = decode(encoded)
        return value


# Attached after the dataclass is made, so the fields keep no default and the generated
# methods (``__init__``, ``__eq__``, ``__repr__``) stay as they are.
RunRecord.input = _DecodedOnFirstRead("input")
RunRecord.launch_options = _DecodedOnFirstRead("launch_options")  # type: ignore[assignment]  # a descriptor in the field's place


def stored_run_record(
    encoded: Mapping[str, tuple[Callable[[Any], Any], Any]], fields: dict[str, Any]
) -> RunRecord:
    """A `RunRecord` as the state store reads it: `encoded` maps ``input`` and
    ``launch_options`` to (decode, stored bytes), decoded only when a hook reads them.

    A claim pass hands every candidate (up to 64) to ``piw_select_run_to_claim`` and
    decoding each one's JSON cost more than the rest of the pass. `fields` are all the
    other fields, by name; the record takes the dict over.
    """
    record = object.__new__(RunRecord)
    fields["_encoded"] = encoded
    record.__dict__.update(fields)
    return record


@dataclass(frozen=True)
class Claim:
    """A fenced claim on a run: owner, generation and expiry (the token stays in the host)."""

    run_id: str
    #: the claiming host's ``host_id``.
    owner_id: str
    #: bumped by every claim of the run; a worker of an older generation is refused.
    generation: int
    #: epoch ms when the lease runs out unless renewed.
    expires_at: int


@dataclass(frozen=True)
class NodeAttemptRecord:
    """One attempt of one node, as ``piw_node_attempt_started``/``_finished`` see it."""

    run_id: str
    workflow_name: str
    node_id: str
    #: the node's kind: ``compute``, ``action``, ``agent``, ``checkpoint``, ``human``, …
    node_kind: str
    #: unique per attempt; the same in the started and the finished notification.
    attempt_id: str
    #: 1 for a node's first attempt, n for its n-th (retries, resumes).
    attempt_number: int
    #: epoch ms, as the worker measured it.
    started_at: int
    #: epoch ms; ``None`` in the started notification.
    finished_at: int | None = None
    #: ``completed``, ``failed``, ``timed_out``, ``cancelled`` or ``interrupted`` (the
    #: worker stopped before the attempt ended: parked, paused or crashed); ``None`` in
    #: the started notification.
    outcome: str | None = None
    #: the exception's class name of a failed attempt (``ValueError``), else ``None``.
    error_class: str | None = None
    #: what went wrong, without the class name, for any outcome but ``completed``.
    error_message: str | None = None
    #: an agent step run by a headless executor, in the finished notification:
    #: ``{"executor": name}`` plus the ``provider``, ``model`` and ``usage`` (token
    #: counts) its result reported; else ``None``.
    agent: dict[str, Any] | None = None


@dataclass(frozen=True)
class WorkerRunCommand:
    """What a freshly started worker does with its run (SPEC §7.3).

    `kind` is one of `start`, `resume`, `restart`, `continue`.
    """

    #: ``start``, ``resume``, ``restart`` or ``continue``.
    kind: str
    #: the run input (start, restart and continue).
    input: Any = None
    #: the parent a continuation carries on from.
    parent_run_id: str | None = None
    #: the answer a continuation resumes with (``{choice, input?}``).
    human_decision: dict[str, Any] | None = None
    #: the waiting agent attempt whose interaction deadline expired (resume).
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

    #: the state home directory.
    home: Path
    #: the host's ``--database`` URL, or None for the home's SQLite file.
    database_url: str | None
    #: the Python interpreter the host runs on.
    python: str


@dataclass(frozen=True)
class WorkerProcessSpec:
    """How to start a worker process: argv, extra environment, working directory,
    niceness and resource limits.

    `forkable` says the launch is the built-in worker command, so the host may fork it
    from its worker fork server (imports already done) instead of spawning a cold one.
    Extra environment, `nice` and `rlimits` keep it forkable: the forked worker applies
    them before the workflow's code runs (variables an interpreter reads at start-up,
    ``PYTHON*`` and ``LD_*``, make it a cold start instead).
    """

    #: the command and its arguments.
    argv: list[str]
    #: variables added to the host's environment.
    env: dict[str, str] = field(default_factory=dict)
    #: the working directory (the run's project), or None for the host's.
    cwd: str | None = None
    #: True only for the built-in worker command.
    forkable: bool = False
    #: added to the host's niceness for the worker (0 to 19; lower needs root).
    nice: int = 0
    #: resource limits of the worker: ``{"RLIMIT_AS": (soft, hard)}``, names from
    #: Python's :mod:`resource` module, ``-1`` for unlimited.
    rlimits: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.nice) is not int or not 0 <= self.nice <= 19:
            raise ValueError(
                f"WorkerProcessSpec.nice must be an integer from 0 to 19, got {self.nice!r}."
            )
        import resource  # Unix only, like the host

        for name, limits in self.rlimits.items():
            if not (isinstance(name, str) and name.startswith("RLIMIT_")) or not hasattr(
                resource, name
            ):
                raise ValueError(
                    f"WorkerProcessSpec.rlimits: {name!r} is not a resource limit here; use "
                    "a name of Python's resource module, such as 'RLIMIT_AS'."
                )
            if not (
                isinstance(limits, tuple)
                and len(limits) == 2
                and all(type(value) is int and value >= -1 for value in limits)
                and (limits[1] == -1 or 0 <= limits[0] <= limits[1])
            ):
                raise ValueError(
                    f"WorkerProcessSpec.rlimits[{name!r}] must be (soft, hard), integers "
                    f"with soft <= hard and -1 for unlimited, got {limits!r}."
                )


@dataclass(frozen=True)
class TurnReport:
    """A session's `workflowTurn.report` payload (SPEC §9.4)."""

    #: ``start`` or ``end`` of a model turn.
    state: str
    #: the session's id for this model turn.
    workflow_turn_id: str
    #: the workflow message the turn answers.
    workflow_message_id: str
    run_id: str
    #: the session reporting.
    target_session_id: str
    #: the reporting coordinator's epoch (the host checked it is current).
    coordinator_epoch: str
    #: why an ended turn stopped (``stop``, ``aborted``, ``error``, ...).
    stop_reason: str | None = None
    #: the session entry holding the model's answer, when the session has one.
    response_session_entry_id: str | None = None
    #: for an ``error`` stop, what failed, e.g. ``The model P/M failed: 503 overloaded``.
    error: str | None = None


@dataclass(frozen=True)
class TurnReceipt:
    """The adjudicated answer to a turn report: outcome, ownership and the saved turn."""

    #: ``accepted`` (a new fact) or ``adopted`` (a repeat of a recorded one).
    outcome: str
    #: ``absent`` (no turn), ``active`` or ``settled``.
    ownership: str
    #: the saved turn (``pi-workflows.workflow-turn.v1``), or None.
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

    #: what the session shows (and the model reads).
    text: str
    #: structured data for clients; the core sets its identity and ``terminal`` keys.
    details: dict[str, Any] = field(default_factory=dict)


# --- dict-shaped hook arguments, typed ------------------------------------------------------
#
# JSON objects that hooks receive and return. They are TypedDicts, so at run time they are
# the plain dicts they always were (a plugin indexing ``facts["status"]`` keeps working),
# and a type checker knows every key.


class EarlierOutcome(TypedDict):
    """One terminal ancestor of a run along ``parentRunId``, oldest first."""

    runId: str
    #: ``completed``, ``failed``, ``timed_out`` or ``cancelled``.
    status: str
    #: why the run ended (the run's status detail), or None.
    reason: str | None
    #: the run's final output (JSON), or None.
    finalOutput: Any
    #: the run's error text, or None.
    error: str | None


class TerminalFacts(TypedDict):
    """What a terminal workflow message says about a finished run (``terminal-result.v1``).

    ``piw_presentation_instructions`` gets the facts without ``terminalFingerprint``;
    ``piw_render_terminal_message`` gets them with it.
    """

    #: always ``pi-workflows.terminal-result.v1``.
    schema: str
    runId: str
    workflowName: str
    #: the name the run was started with (a path or name; part of the fingerprint).
    workflowRef: str
    #: the run's input (JSON).
    input: Any
    #: ``completed``, ``failed``, ``timed_out`` or ``cancelled``.
    status: str
    #: the final output (JSON) of a completed run, else None.
    finalOutput: Any
    #: the error text of a run that did not complete, else None.
    error: str | None
    #: the run's status detail (why it ended), or None.
    reason: str | None
    #: 0 for a first run, n for the n-th restart in its chain.
    restartNumber: int
    #: terminal ancestors (restart and continuation chain), oldest first.
    earlierOutcomes: list[EarlierOutcome]
    #: sha-256 over workflowRef, input, status, finalOutput, error and reason: the same
    #: outcome repeated across a restart chain has the same fingerprint.
    terminalFingerprint: NotRequired[str]


class DecisionChoice(TypedDict):
    """One choice of a human decision, keyed by its id in ``ChannelRequest.choices``."""

    #: the button text.
    label: str
    #: the free-text field answered together with this choice: ``{name, prompt}``.
    input: NotRequired[dict[str, str]]


class ChannelRequest(TypedDict):
    """What a decision channel may show: presentation and choices, never the private subject."""

    #: always ``pi-workflows.human-decision-channel-request.v1``.
    schema: str
    decisionId: str
    #: digest of the full request (subject included); changes if the request would.
    requestDigest: str
    runId: str
    workflowName: str
    nodeId: str
    #: the audience the workflow addressed (``[audiences]`` of channels.toml).
    audience: str
    title: str
    #: ``{schema, summary, blocks: [...]}`` (``decision-presentation.v1``).
    presentation: dict[str, Any]
    presentationDigest: str
    #: choice id → choice.
    choices: dict[str, DecisionChoice]
    #: ISO 8601 UTC times; ``expiresAt`` is None without a deadline.
    createdAt: str
    expiresAt: str | None
    #: the response applied when the deadline passes (``{choice, input?}``), or None.
    defaultResponse: dict[str, Any] | None


class DecisionResolution(TypedDict):
    """The winning answer of a decision (``settle``'s ``resolution``)."""

    #: ``human`` (an answer), ``timeout`` (the default response at the deadline) or
    #: ``cancellation`` (the run was cancelled first).
    provenance: str
    #: the channel the winning answer came through, or None.
    channel: str | None
    #: who answered, or None.
    actor: str | None
    #: ``{choice, input?}``, or None for a cancellation.
    response: dict[str, Any] | None
    #: ISO 8601 UTC.
    resolvedAt: str
    #: the run that carries the workflow on with this answer, once created.
    continuationRunId: str | None


#: What a channel's ``deliver`` returned (stored as JSON; None when it returned nothing
#: JSON can hold). ``settle`` gets it back to find its own message, e.g. a chat message id.
ChannelDelivery = dict[str, Any] | None


class AnswerResult(TypedDict):
    """What ``ChannelContext.report_answer`` returns (all three keys are always present)."""

    #: ``accepted`` (this answer won), ``adopted`` (the identical answer had already won),
    #: ``conflict`` (another answer won first) or ``rejected`` (not allowed, unknown
    #: decision or choice, bad input).
    outcome: str
    #: ``{decisionId, parentRunId, status, winner, continuationRunId}`` for accepted,
    #: adopted and conflict (``winner`` is the response that won); else None.
    receipt: dict[str, Any] | None
    #: for conflict and rejected: the sentence to show the person who answered; else None.
    error: str | None


class StepContract(TypedDict):
    """The identity of one agent step attempt (also in the prompt's contract block)."""

    runId: str
    workflowName: str
    nodeId: str
    #: unique per attempt; a retried step gets a new one.
    attemptId: str
    #: the author's description of the output, or None for the default.
    expectedOutput: str | None
    #: always ``submit``: the step is done when its output is accepted.
    completion: str


class AgentStepRequest(TypedDict):
    """What an agent executor's ``run_agent_step`` gets for a headless step."""

    contract: StepContract
    #: what ``piw_step_prompt`` wrote (built-in: the authored prompt followed by the step
    #: contract block); send it to the model.
    prompt: str
    #: ``{statusDetail}``: a short text to show while the step runs, or None.
    presentation: dict[str, Any]
    #: ``accept(output)`` runs the step's checks now — tolerant parsing, the node's
    #: validator, the JSON round trip — and returns ``{"ok": True, "value": v}`` or
    #: ``{"ok": False, "error": sentence}`` without ending the attempt, so the executor can
    #: hand a rejection back to its agent to correct. Once a value was accepted it is the
    #: step's output, whatever ``run_agent_step`` then returns.
    accept: Callable[[Any], dict[str, Any]]
    #: ``publish_update(type, key, data)`` publishes a non-completing update of this attempt
    #: (the envelope checks and rate limit of an action's ``publish_update``); returns its
    #: receipt ``{updateId, sequence, ...}``.
    publish_update: Callable[[str, str, dict[str, Any]], dict[str, Any]]
    #: a `pi_workflows.engine.agents.AgentTranscript`: ``add(kind, **fields)`` what the
    #: agent did — ``kind`` a short word of your choosing (the pi executor writes
    #: ``prompt``, ``assistant``, ``error``, …), ``fields`` JSON values, each cut to 2,000
    #: characters; thread-safe. The engine keeps it (bounded) with the attempt when the
    #: attempt ends in the worker, and ``pi-workflows run transcript`` prints each entry's
    #: kind and fields.
    transcript: Any


class AgentStepResult(TypedDict):
    """What ``run_agent_step`` returns: the step output.

    JSON, or text containing JSON (the engine parses it tolerantly: the whole text, a
    fenced block, or the first balanced ``{…}``/``[…]``); then the node's validator runs.
    ``provider``, ``model`` and ``usage`` (token counts such as ``{"input": 1200,
    "output": 85}``) are optional: what the executor reports of who answered reaches
    ``piw_node_attempt_finished`` in ``NodeAttemptRecord.agent``.
    """

    output: Any
    provider: NotRequired[str]
    model: NotRequired[str]
    usage: NotRequired[dict[str, int]]


class WorkerLaunchEnvelope(TypedDict):
    """Everything a worker process needs to execute one claimed run (``worker-launch.v1``)."""

    schema: str
    runId: str
    #: the claim generation the worker acts under; stale generations are refused.
    generation: int
    #: a fresh secret per launch; the worker's messages carry it.
    workerEpoch: str
    #: the run's project directory (the worker's working directory).
    projectPath: str
    #: where the workflow definition comes from (``{kind, ...}``).
    workflowSource: dict[str, Any]
    definitionDigest: str
    inputHash: str
    protocolVersion: int
    #: the host's database URL with its password masked, or None for the home's SQLite file.
    databaseUrl: str | None
    #: the state home directory.
    home: str


# --- decision channels ------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelSettings:
    """One configured channel of ``<config>/channels.toml``."""

    #: the channel's name (its table name in channels.toml).
    name: str
    #: the registered channel kind that builds it (``kind = ...``, default the name).
    kind: str
    #: who may answer through it (``allowed_actors``); None admits any actor.
    allowed_actors: tuple[str, ...] | None = None
    #: the table's other keys, as written.
    options: Mapping[str, Any] = field(default_factory=dict)
    #: ``{key: secret}`` read from the table's ``<key>_file`` entries; never log them.
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: attempts a delivery or settlement gets before it gives up (``delivery_attempts``,
    #: default 3).
    delivery_attempts: int = 3
    #: the wait before retry n is n times this (``retry_delay_ms``, default 1000).
    retry_delay_ms: int = 1000

    def allows(self, actor: str) -> bool:
        """Whether `actor` may answer through this channel."""
        return self.allowed_actors is None or actor in self.allowed_actors


@dataclass(frozen=True)
class ChannelContext:
    """What a decision channel factory gets: its settings and two ways back into the host.

    ``name``, ``options`` and ``credentials`` are shortcuts to ``settings``. Build one in a
    test with ``pi_workflows.testing.channel_context``.
    """

    settings: ChannelSettings
    #: ``report_answer(decision_id, choice, input=None, *, actor)``: submit a human
    #: answer; call it from any thread but the host's loop (it blocks until the host
    #: decided); returns an :class:`AnswerResult`.
    report_answer: Callable[..., AnswerResult]
    #: ``store_call(fn)``: run ``fn()`` in a state-store transaction on the host's loop and
    #: return its result (for built-in channels whose delivery is a database write).
    store_call: Callable[[Callable[[], Any]], Any]

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def options(self) -> Mapping[str, Any]:
        return self.settings.options

    @property
    def credentials(self) -> Mapping[str, str]:
        return self.settings.credentials


@dataclass(frozen=True)
class ChannelGaveUp:
    """A channel call the host stopped retrying, as ``piw_channel_gave_up`` sees it."""

    #: the channel's name in channels.toml.
    channel_name: str
    #: the registered kind that built it (``webhook``, …).
    channel_kind: str
    #: ``delivery`` (offering the decision) or ``settlement`` (taking it back).
    purpose: str
    #: the channel effect; ``pi-workflows effects retry <effect_id>`` tries it once more.
    effect_id: str
    #: the attempts made, every one rejected (the channel's ``delivery_attempts``).
    attempts: int
    #: the text of the last attempt's ``ChannelDeliveryError``, as the channel wrote it.
    error: str
    #: when the host gave up, epoch ms.
    at: int
    #: what the channel was asked to show (``decisionId``, ``runId``, ``workflowName``,
    #: presentation and choices; never the private subject).
    request: ChannelRequest
    #: the channel object the kind's factory built, so a plugin knows its own channels
    #: (``isinstance``) and can tell them; a notification thread is not the channel's
    #: own, so only call what may run beside its other calls.
    channel: Any = field(repr=False)


class TurnContext(Protocol):
    """What ``piw_adjudicate_turn_report`` may read and write (its ``ctx``).

    The host's implementation (``pi_workflows.host.session_turns``) runs every call inside
    the report's open transaction; plugins see only this shape.
    """

    now: int

    def get_turn(self, turn_id: str) -> dict[str, Any] | None: ...
    def message(self, message_id: str) -> dict[str, Any]: ...
    def run_is_terminal(self, run_id: str) -> bool: ...
    def run_is_paused(self, run_id: str) -> bool: ...
    def open_message_id(self, session_id: str) -> str | None: ...
    def pending_step(self, message_id: str) -> dict[str, Any] | None: ...
    def unproductive_turn_limit(self, step: dict[str, Any]) -> int: ...
    def start_turn(self, report: TurnReport) -> dict[str, Any]: ...
    def begin_step_turn(self, message: dict[str, Any]) -> None: ...
    def end_turn(self, report: TurnReport) -> dict[str, Any]: ...
    def count_unproductive_end(self, request_id: str) -> int | None: ...
    def remind(self, request_id: str, preface: str) -> None: ...
    def pause_step(self, request_id: str) -> None: ...
    def fail_step(self, request_id: str, error: str, code: str = "unproductiveTurns") -> None: ...


# A decision channel kind's factory: called with the channel's context, returns the
# channel object (``deliver``/``settle``/``close``, each optional; see the hook).
ChannelFactory = Callable[[ChannelContext], Any]
# What ``piw_register_decision_channels`` receives: ``register(kind, factory)``.
RegisterChannel = Callable[[str, ChannelFactory], None]
