"""The pi-workflows plugin API: every hook specification, documented.

This module is the reference for extension authors. A plugin is any module or object
with functions decorated by :data:`hookimpl` whose names match the specifications below.
Ship one with an entry point in the group ``pi_workflows``::

    [project.entry-points.pi_workflows]
    my_plugin = "my_package.plugin"

or name a module in ``PI_WORKFLOWS_PLUGINS`` for a local one-off. Built-in behaviour is
registered first through the same hooks (``pi_workflows.builtin``), so every default can
be replaced: for a first-result hook the most recently registered implementation runs
first, and the first one to return something other than ``None`` decides. Return
``None`` to let the next implementation decide.

How the core calls each hook is its :class:`HookContract`, declared beside the spec
(``@hook(...)``): its kind (first-result, collect or notification), whether an answer is
required (when every implementation returns ``None`` — say the built-in was disabled with
``PI_WORKFLOWS_DISABLE_PLUGINS`` — the core raises one sentence naming the hook and the
disabled plugin), whether each implementation is called on its own (one that raises is
reported by name and the others still run), whether it runs under the hook deadline on a
helper thread (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``, default 1000 ms: a plugin that hangs
there costs the host one deadline, not its loop, and is named in the log and ``host
status``; being on another thread, it does not share the host's database connection,
except through a turn report's ``ctx``) — the claim, launch, turn-adjudication,
terminal-message and notification hooks — and whether it is called inside or outside a
state-store transaction. Hooks must be fast: slow work (network, agents) belongs in
channel adapters and executors. The notifications (``piw_run_claimed``,
``piw_run_transition``, ``piw_node_attempt_started``/``_finished``,
``piw_worker_exited``, ``piw_channel_gave_up``) are delivered on a thread of each
plugin's own, in order, under the hook deadline: a plugin whose call is
past it is named once in the log and misses what is announced until that call returns,
and nothing else waits for it.
The invariants — claim fencing, receipts, message ids, one winner per decision — are
enforced by the core; hooks choose policy and presentation only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pluggy

from .records import (
    ChannelGaveUp,
    Claim,
    HostInfo,
    MessageContent,
    NodeAttemptRecord,
    RegisterChannel,
    RunRecord,
    StepContract,
    TerminalFacts,
    TurnContext,
    TurnReceipt,
    TurnReport,
    WorkerLaunchEnvelope,
    WorkerProcessSpec,
    WorkerRunCommand,
    WorkerSettings,
)

if TYPE_CHECKING:  # workers never need click or peewee, so keep them off their import path
    import click
    import peewee

PROJECT_NAME = "pi_workflows"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

# --- calling contracts -----------------------------------------------------------------
#
# Each spec below carries its calling contract, declared once beside it: the core's hook
# façade (pi_workflows/plugins.py) calls the hook as its contract says, the reference page
# of each hook states it (docs/reference_pages.py), and tests/test_hook_coverage.py checks
# the hooks against it.

#: ``first-result``: implementations run from the last registered to the first and the
#: first answer other than ``None`` decides. ``collect``: every implementation runs and
#: contributes. ``notification``: every implementation is told; answers are ignored and
#: failures only logged.
HookKind = Literal["first-result", "collect", "notification"]
#: ``outside``: never called inside a state-store transaction (so a slow plugin holds no
#: lock). ``inside``: called inside the transaction of the change it decides, and must
#: only use what it is given.
Transaction = Literal["outside", "inside"]


@dataclass(frozen=True)
class HookContract:
    """How the core calls one hook."""

    kind: HookKind
    #: A first-result hook the core cannot go on without: when every implementation
    #: answers ``None`` the core raises a sentence naming the hook (and a disabled built-in).
    required: bool = False
    #: Each implementation is called on its own, so one that raises (or hangs) is reported
    #: by name and the others still run; a plugin that wraps the hook is refused.
    isolated: bool = False
    transaction: Transaction = "outside"
    #: Called on a helper thread under the hook deadline (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``,
    #: default 1000 ms): each implementation on its own when ``isolated``, else the whole
    #: hook call (wrappers included), and then only when a plugin implements it. A plugin
    #: past the deadline is logged once, shown in ``host status`` and left out until its
    #: call returns; what the hook's docstring says happens to that call.
    deadline: bool = False
    #: Filled in from the spec: its name and return annotation.
    name: str = ""
    returns: str = ""


#: Hook name → its contract, for every spec of this module.
CONTRACTS: dict[str, HookContract] = {}

_Spec = TypeVar("_Spec", bound=Callable[..., Any])


def hook(contract: HookContract) -> Callable[[_Spec], _Spec]:
    """Declare a hook spec with its calling contract (and pluggy's spec marker)."""

    def declare(spec: _Spec) -> _Spec:
        returns = str(spec.__annotations__.get("return", "None"))
        CONTRACTS[spec.__name__] = replace(contract, name=spec.__name__, returns=returns)
        marked: _Spec = hookspec(firstresult=contract.kind == "first-result")(spec)
        return marked

    return declare


FIRST_RESULT = HookContract("first-result")
REQUIRED = HookContract("first-result", required=True)
REGISTRATION = HookContract("collect", isolated=True)
NOTIFICATION = HookContract("notification", isolated=True, deadline=True)
# A required first-result hook the host waits for, called under the hook deadline.
REQUIRED_IN_TIME = HookContract("first-result", required=True, deadline=True)


# --- storage ---------------------------------------------------------------------------


@hook(FIRST_RESULT)
def piw_open_database(url: str | None, home: Path) -> peewee.Database | None:
    """Open the state database.

    :param url: the ``--database`` / ``PI_WORKFLOWS_DATABASE`` value, or ``None``.
    :param home: the resolved state home directory.
    :returns: an unconnected ``peewee.Database``, or ``None`` for "not mine".

    Called once per process that touches state (CLI command, host, worker-side tools)
    before any query. ``firstresult``. The built-in (``pi_workflows.builtin.storage``)
    opens ``<home>/state.sqlite`` when ``url`` is ``None``, a ``sqlite:///path`` URL or a
    plain path, and ``postgresql://…`` URLs through ``playhouse.db_url``. Schema checks
    and pragmas are applied by the core afterwards, whatever the plugin returns: it
    creates the schema in an empty database (upgrades or refuses an older one), and for
    any ``peewee.SqliteDatabase`` refuses a file that holds something other than
    pi-workflows state, creates a missing file with mode 0600 and sets ``journal_mode=wal``,
    ``synchronous=full``, ``foreign_keys=1`` and ``busy_timeout=5000`` — so return a plain
    ``peewee.SqliteDatabase(path)``.

    Every process that opens state must resolve the same URL to the same database: the
    plugin must be installed, and ``--database`` / ``PI_WORKFLOWS_DATABASE`` plus any
    setting the plugin reads must be set, wherever the CLI and the host run (workers
    inherit the host's environment and get its URL). ``host status`` shows the URL as
    given. Raise a ``pi_workflows.plugin.PiWorkflowsError`` subclass with a sentence for
    a URL that is yours but cannot be opened; the CLI prints it on one line.
    """


# --- claiming --------------------------------------------------------------------------


@hook(HookContract("first-result", required=True, isolated=True, deadline=True))
def piw_select_run_to_claim(candidates: list[RunRecord], host: HostInfo) -> RunRecord | None:
    """Pick the next run this host should claim.

    :param candidates: claimable runs (not terminal, available, lease free or expired,
        not paused, not blocked, not vetoed in this pass); never empty. At most the claim
        window (64, ``PI_WORKFLOWS_CLAIM_WINDOW``) of them, the highest ``priority``
        first and then the oldest, so an urgent run is always in view.
    :param host: the host asking, with its current worker count.
    :returns: one element of ``candidates``, or ``None`` to defer to the next plugin.

    Called by the host's claim gate (the claim pass after a run is queued or a worker
    slot frees, every poll, 2 s; `run resume`) while the host has room for another
    worker, **outside any database transaction** and on a helper thread: each call has a
    deadline (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``, default 1000). Called again with the
    candidates left after each pick, until the free slots are filled. ``firstresult``;
    an answer is required (the host logs which plugin is missing when nobody answers).
    An implementation that raises, returns a run that is not a candidate or misses the
    deadline is left out (a hung one until its call returns) and named in ``host
    status``, ``run why`` and the log; the next implementation answers instead, at last
    the built-in (``pi_workflows.builtin.claiming``), which returns the candidate with
    the highest ``priority``, then the oldest ``available_at``, then the oldest
    ``created_at``. The core still takes the claim by compare-and-set, so a stale choice
    is harmless.
    """


@hook(HookContract("collect", isolated=True, deadline=True))
def piw_may_claim(run: RunRecord, host: HostInfo) -> bool | None:
    """Veto claiming one run now.

    :param run: the run about to be claimed.
    :param host: the host that would claim it.
    :returns: ``False`` to veto; ``True`` or ``None`` to allow.

    Called for the selected candidate before the claim is taken, by every path that
    starts a worker (the claim pass, `run resume`, a submission to validate, an expired
    step deadline); **outside any database transaction**, on a helper thread, each call
    with a deadline (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``, default 1000). Every
    implementation runs and any ``False`` vetoes: that run stays queued and the pass
    goes on with the other candidates. The host remembers a veto until the run changes
    (its revision) or its worker count (``host.active_workers``) changes; each poll asks
    again the vetoes it remembered longest, so a veto that depends on something else
    lifts within a few polls. An implementation that raises or misses the deadline is
    left out (a hung one until its call returns: it then allows) and named in ``host
    status``, ``run why`` and the log. No built-in: capacity (``max_workers``, default
    4, ``PI_WORKFLOWS_MAX_WORKERS``) is the host's own stop and ends a pass before this
    hook is asked.
    """


@hook(NOTIFICATION)
def piw_run_claimed(run: RunRecord, claim: Claim) -> None:
    """Notification: the host claimed ``run`` with ``claim`` and will launch a worker.

    Called after the claim transaction committed, for every claim: claim passes, and
    resume claims (``run resume``, a submission to validate, an expired step deadline);
    delivered like :func:`piw_run_transition` (the plugin's notification thread, in order
    after the run's ``claimed`` transition, under the hook deadline). Return values are
    ignored; an exception or a missed deadline is logged with the plugin's name, never
    propagated. No built-in.
    """


# --- worker launch ---------------------------------------------------------------------


@hook(REQUIRED_IN_TIME)
def piw_worker_run_command(
    record: RunRecord, resume_interaction_attempt_id: str | None
) -> WorkerRunCommand | None:
    """Choose what a freshly started worker does with its run (SPEC §7.3).

    :param record: the run's **current** queue record, read when the worker said ready
        (for a run that never ran: read at launch, after the claim committed).
    :param resume_interaction_attempt_id: the waiting agent attempt whose interaction
        deadline the host expired, when the run has one (the engine records it
        ``timed_out``); accepted and validating submissions reach the engine through the
        run state.
    :returns: a :class:`~pi_workflows.records.WorkerRunCommand`, or ``None``.

    Called by the host when a worker reports ``worker.ready``, or for a run that never
    ran when it launches the worker (the answer goes with the launch). ``firstresult``. A
    ``ValueError`` raised here fails the launch with its message. Under the hook deadline
    (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``, default 1000 ms), on a helper thread: a plugin that
    does not answer in time is named once in the log and in ``host status`` and left out
    until its call returns; the next implementation answers, at last the built-in, so the
    launch goes on after one deadline. The built-in
    (``pi_workflows.builtin.launch``) applies, in order: initialized run → ``resume``;
    ``restart`` lineage → ``restart``; ``continuation`` lineage → ``continue`` (error when
    the parent is missing); a parent without lineage → error; else ``start``.
    """


@hook(REQUIRED_IN_TIME)
def piw_worker_process(
    envelope: WorkerLaunchEnvelope, settings: WorkerSettings
) -> WorkerProcessSpec | None:
    """Describe the process that executes one worker launch.

    :param envelope: the launch envelope, a
        :class:`~pi_workflows.records.WorkerLaunchEnvelope` (``worker-launch.v1``).
    :param settings: host settings (home, database URL, Python executable).
    :returns: a :class:`~pi_workflows.records.WorkerProcessSpec`, or ``None``.

    Called by the host right before spawning a worker. ``firstresult``. The host always
    puts the worker in its own process group and speaks the worker protocol on its
    stdin/stdout, whatever the spec says. The built-in (``pi_workflows.builtin.launch``)
    returns ``[sys.executable, "-m", "pi_workflows.worker"]`` with the envelope in the
    ``PI_WORKFLOWS_WORKER_LAUNCH`` environment variable and cwd = the project path. To
    run it with extra variables, a niceness or resource limits, wrap it
    (``pi_workflows.plugin.default_worker_process``) and ``dataclasses.replace`` its
    ``env``, ``nice`` or ``rlimits``: the worker is still forked from the pre-forked fork
    server and applies them before the workflow's code runs. A spec with another
    ``argv`` is spawned as given, the limits set on it right after it starts; a bad
    ``nice`` or ``rlimits`` fails the launch with a sentence naming the plugin. Under the
    hook deadline like :func:`piw_worker_run_command`: a plugin that hangs costs the
    launch one deadline, and the built-in's spec is used while its call hangs.
    """


# --- turns -----------------------------------------------------------------------------


@hook(HookContract("first-result", required=True, transaction="inside", deadline=True))
def piw_adjudicate_turn_report(report: TurnReport, ctx: TurnContext) -> TurnReceipt | None:
    """Decide which workflow turn a session's model turn belongs to (SPEC §9.4).

    :param report: the ``workflowTurn.report`` payload. The host has already checked
        that the reporter is the session's current coordinator and reported its branch.
    :param ctx: a :class:`~pi_workflows.records.TurnContext`. Reads:
        ``get_turn(id)`` (the saved turn as ``pi-workflows.workflow-turn.v1`` JSON, or
        ``None``), ``message(id)`` (``{workflowMessageId, kind, sourceId, runId,
        targetSessionId, status}``), ``run_is_terminal(run_id)`` (missing, or queue done,
        failed or cancelled), ``run_is_paused(run_id)``, ``open_message_id(session_id)``,
        ``pending_step(message_id)`` (``{requestId, runId, nodeId, unproductiveTurnEnds,
        paused, validating}`` of the pending step a message presents, or ``None``),
        ``unproductive_turn_limit(step)`` (asks ``piw_unproductive_turn_limit``) and
        ``now`` (epoch ms). Writes: ``start_turn(report)`` (opens a turn, or returns the
        saved one of a repeated start), ``begin_step_turn(message)`` (cancels the step's
        superseded pending prompts), ``end_turn(report)`` (records the end, nothing
        more), and the consequences a policy may give a step: ``pause_step(request_id)``,
        ``count_unproductive_end(request_id)`` (the new count, or ``None``),
        ``remind(request_id, preface)`` (a ``reminder`` step message starting with
        ``preface``) and ``fail_step(request_id, error, code="unproductiveTurns")`` (the
        run fails with that code and error). Writes raise
        :class:`~pi_workflows.errors.TurnConflictError` for a conflicting report, which
        the host answers ``rejected``.
    :returns: a :class:`~pi_workflows.records.TurnReceipt` (outcome ``accepted`` or
        ``adopted``; ownership ``absent`` with no turn, or ``active``/``settled`` with
        the saved turn), or ``None`` to defer to the next implementation.

    Called by the host **inside** the report's transaction; it must only use ``ctx`` to
    read and write, and an exception rolls the whole report back. ``firstresult``. When a
    plugin implements it, the call runs on a helper thread under the hook deadline
    (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``, default 1000 ms) while each ``ctx`` call runs on
    the host's thread, in the transaction. A plugin past the deadline fails that one
    report (the client hears the sentence naming it; what it wrote through ``ctx`` is
    rolled back), is named once in the log and in ``host status``, and is left out of
    later reports (the next implementation, at last the built-in, adjudicates them)
    until its call returns. The
    built-in (``pi_workflows.builtin.turns``) implements the 0.16.2 rules: ownership
    ``absent``/``active``/``settled``, adoption of late and duplicate reports, rejection
    of conflicting ends, and the turn-end consequences (an ``aborted`` step turn pauses
    the run; an ``error`` end whose report says what failed — ``report.error``, e.g. the
    provider's error — fails it ``modelFailed`` with that error; any other end without a
    valid submission earns a reminder until ``piw_unproductive_turn_limit`` fails the
    run). The ``lost`` ends the host infers
    from an idle branch report are adjudicated here too.
    """


@hook(HookContract("first-result", required=True, transaction="inside"))
def piw_unproductive_turn_limit(run: RunRecord, node_id: str) -> int | None:
    """How many agent turns may end without a valid submission before the run fails.

    Called when a step turn ends unproductively. ``firstresult``; the answer must be a
    positive integer. The built-in (``pi_workflows.builtin.turns``) returns 3.
    """


# --- terminal messages -----------------------------------------------------------------


@hook(REQUIRED_IN_TIME)
def piw_presentation_instructions(run: RunRecord, facts: TerminalFacts) -> str | None:
    """The instruction line of a terminal workflow message.

    :param run: the terminal run.
    :param facts: the :class:`~pi_workflows.records.TerminalFacts`, without
        ``terminalFingerprint``.
    :returns: one or more sentences telling the model how to present the result.

    Called in the host, after the run's terminal state committed and outside any
    transaction, before rendering. ``firstresult``. Under the hook deadline
    (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``, default 1000 ms), on a helper thread: a plugin that
    does not answer in time is named once in the log and in ``host status`` and left out
    until its call returns; the built-in's instructions are used meanwhile. The built-in
    (``pi_workflows.builtin.terminal``) returns the run's ``presentation_prompt`` for a
    completed run, else "Explain the final workflow result to the user in a normal
    response."
    """


@hook(REQUIRED_IN_TIME)
def piw_render_terminal_message(facts: TerminalFacts, instructions: str) -> MessageContent | None:
    """Render the terminal workflow message for the origin session.

    :param facts: the :class:`~pi_workflows.records.TerminalFacts`, with
        ``terminalFingerprint``.
    :param instructions: the result of :func:`piw_presentation_instructions`.
    :returns: :class:`~pi_workflows.records.MessageContent` (text and details).

    Called once per terminal run (again only if an earlier attempt failed).
    ``firstresult``. An exception leaves the run terminal and schedules a retry (at most
    once a second). Under the hook deadline like :func:`piw_presentation_instructions`: a
    plugin that hangs costs the message one deadline, and the built-in renders it. The
    core sets ``workflowMessageId``, ``runId``, ``kind`` and
    ``terminal`` (the facts with the fingerprint) in the returned details, whatever the
    plugin put there. The built-in (``pi_workflows.builtin.terminal``) produces the
    reference layout of SPEC §10; ``docs/terminal-messages.md`` walks through a plugin.
    """


# --- decisions -------------------------------------------------------------------------


@hook(REGISTRATION)
def piw_register_decision_channels(register: RegisterChannel) -> None:
    """Register decision channel kinds: ``register(kind, factory)``.

    Called once when the host starts and loads ``<config>/channels.toml`` (see
    ``pi_workflows.host.decision_channel_runner``). Every implementation runs on its own:
    one that raises is logged by name and the others (built-ins included) still
    register. For each configured channel of that kind the host calls
    ``factory(context)`` and uses the object it returns.

    The context (:class:`~pi_workflows.records.ChannelContext`; build one in tests with
    ``pi_workflows.testing.channel_context``):

    - ``name``: the channel's name in channels.toml; ``options``: its other keys;
      ``credentials``: ``{key: secret}`` read from its ``<key>_file`` entries (never log);
      ``settings.allows(actor)``: whether ``allowed_actors`` admits ``actor``;
    - ``report_answer(decision_id, choice, input=None, *, actor)``: submit a human answer
      from any thread but the host's loop (blocks until the host decided) →
      :class:`~pi_workflows.records.AnswerResult`;
    - ``store_call(fn)``: run ``fn()`` in a state-store transaction on the host's loop
      (for built-in channels whose delivery is a database write).

    The channel object:

    - ``deliver(request) -> dict | None`` (optional): offer a decision. ``request`` is a
      :class:`~pi_workflows.records.ChannelRequest` (presentation and choices, never the
      private subject). What it returns is kept as the
      :data:`~pi_workflows.records.ChannelDelivery` (JSON: e.g. a chat message id). A
      channel without it has nothing to push (people ask for decisions, as with
      ``cli``): its delivery is recorded ``applied`` in the commit that created the
      decision, with no call;
    - ``settle(request, resolution, delivery) -> dict | None`` (optional): the decision
      was resolved; ``resolution`` is a :class:`~pi_workflows.records.DecisionResolution`
      naming the winner, ``delivery`` what this channel's ``deliver`` returned; e.g.
      remove buttons. A channel without it has nothing to take back: its settlement is
      recorded ``applied`` in the commit that resolved the decision, with no call;
    - ``close()`` (optional): the host is stopping;
    - ``gave_up(request, purpose, error)`` (optional): the host stopped trying a
      delivery (``purpose`` ``delivery``) or settlement (``settlement``) of ``request``;
      called by the built-in :func:`piw_channel_gave_up`, which says when;
    - ``answer_actor(answer)`` (optional): who a client answering through
      ``decision.answer`` with this channel is. ``answer`` is ``{decisionId, runId,
      originSessionId, sessionId}``; return the actor's name, or raise
      ``pi_workflows.plugin.AnswerNotAllowedError``. Called on the host's loop, so it
      must not block. A channel without it is answered only through ``report_answer``.

    Factories and the other methods run on the channel's own thread, never on the host's event
    loop. Raise ``pi_workflows.plugin.ChannelDeliveryError`` when a call definitely did
    not happen (the host retries it — ``delivery_attempts`` in all, 3 unless the
    channel's table in channels.toml says, the n-th retry ``retry_delay_ms`` × n later,
    default 1000 — then gives it up, announces it (:func:`piw_channel_gave_up`), and the
    effect stays ``rejected`` until an operator runs ``pi-workflows effects retry``, see
    docs/decisions.md); any
    other exception, or no
    return within the call timeout, makes the effect ambiguous until an operator runs
    ``pi-workflows effects confirm|retry``. Answers are reported through ``report_answer``;
    the host accepts them only from channels of the decision's audience and actors the
    channel allows. The built-in (``pi_workflows.builtin.decision_channels``) registers
    ``session`` and ``cli``.
    """


@hook(NOTIFICATION)
def piw_channel_gave_up(gave_up: ChannelGaveUp) -> None:
    """Notification: the host stopped retrying a decision channel's delivery or settlement.

    :param gave_up: a :class:`~pi_workflows.records.ChannelGaveUp`: the channel's name
        and kind, ``purpose`` (``delivery`` or ``settlement``), the channel effect's id,
        the attempts made, the last attempt's ``ChannelDeliveryError`` text, when, the
        request (presentation and choices, never the private subject) and the channel
        object itself.

    Called when a channel's last attempt (``delivery_attempts``, 3 unless channels.toml
    says) raised ``ChannelDeliveryError``: the effect stays ``rejected (gave up)`` —
    ``effects list``, ``host status`` and ``channel.status`` show it so — that channel is
    not called again for the decision, and only an operator's ``pi-workflows effects
    retry`` tries it once more (after which a failure is announced again). It is for the
    channel's plugin (tell your channels by ``gave_up.channel_kind`` or
    ``isinstance(gave_up.channel, ...)``) or an operator's (page someone when any
    channel gives up). An attempt that ended otherwise (another exception, no answer
    within the call timeout) is ambiguous, not given up, and is not announced here.

    Delivery: in the host that made the attempts, after the commit that recorded the
    last one, outside any transaction; once per giving up, at most once (a host killed
    between the commit and the call never makes it). Delivered like
    :func:`piw_run_transition`: on the plugin's notification thread, in order with its
    other notifications, under the hook deadline — not on the channel's own thread, so a
    call into the channel may run beside its other calls. Every implementation runs; an
    exception is logged with the plugin's name and never reaches the host. The built-in
    (``pi_workflows.builtin.decision_channels``) calls the channel's own optional
    ``gave_up(request, purpose, error)`` method (the channel interface of
    :func:`piw_register_decision_channels`), on its notification thread.
    """


# --- workflows -------------------------------------------------------------------------


@hook(REGISTRATION)
def piw_register_workflows(register: Callable[..., None]) -> None:
    """Register workflows shipped by a plugin: ``register(name, workflow, revision=...)``.

    Called during discovery, after project and user directories (first name wins).
    Every implementation runs on its own, with a ``register`` that knows the plugin: a
    third party's workflows get source kind ``plugin`` (with the plugin's name), and a
    plugin that raises is listed as broken without hiding anyone else's. The built-in
    (``pi_workflows.builtin.workflows``) registers ``hello``, ``shell``, ``echo``,
    ``branch``, ``two-turn`` and ``human-decision``.
    """


@hook(REGISTRATION)
def piw_workflow_dirs(project: Path) -> list[Path] | None:
    """Directories searched for ``<name>.workflow.py`` files, in precedence order.

    :param project: the project directory of the command.
    :returns: a list of directories (missing ones are skipped).

    Called during discovery; results of all implementations are concatenated, built-in
    first. A plugin that raises is logged by name and skipped. The built-in
    (``pi_workflows.builtin.workflows``) returns ``<project>/.pi/workflows`` and
    ``<config>/workflows``.
    """


# --- agents ----------------------------------------------------------------------------


@hook(REGISTRATION)
def piw_register_agent_executors(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register headless agent executors: ``register(name, factory)``.

    Called in the worker when a headless run reaches an agent step (interactive runs ask
    their origin session instead). Every implementation runs on its own (one that
    raises is logged by name and skipped); the first registration of a name wins. The
    executor contract:

    - **choice**: the worker uses the executor named by ``PI_WORKFLOWS_AGENT_EXECUTOR``
      in the host's environment (default ``command``); an unregistered name fails the
      step with the list of registered ones;
    - **factory**: ``factory()`` is called with no arguments, once per agent step, and
      returns the executor; raise ``pi_workflows.plugin.AgentExecutorError`` with
      a sentence for the user when it cannot work (missing configuration, say);
    - **step**: ``executor.run_agent_step(request, signal)`` runs one step and returns
      an :class:`~pi_workflows.records.AgentStepResult` (``{"output": ...}``).
      ``request`` is an :class:`~pi_workflows.records.AgentStepRequest`: ``prompt``
      (what :func:`piw_step_prompt` wrote: send it to the model as is),
      ``contract`` (run, workflow, node and attempt ids, expected output),
      ``presentation``, ``accept`` (check an output now; a rejection can go back to the
      agent, an accepted value is the step's output), ``publish_update`` and
      ``transcript`` (what the agent did, stored with the attempt). ``signal``
      (``pi_workflows.plugin.AbortSignal``) is set when the attempt stops being
      active (cancelled, paused, deadline): poll
      ``signal.is_aborted`` or block in ``signal.wait(timeout)``, then return or raise
      promptly; an ignored signal leaves the call running but its result is refused. An exception
      fails the attempt with its message; the node's retry policy decides what follows;
    - **early start** (optional): ``executor.prepare()``, if the executor has it, is
      called once when a headless run with agent steps starts or resumes in a worker, so
      the executor can start its agent before the first step needs it (the ``pi``
      executor starts its ``pi``). It must not block; processes it starts go through
      :func:`pi_workflows.plugin.start_registered` like a step's. An exception
      is ignored: the first step reports what is wrong.

    The call runs in the worker process, on the engine's thread; it may block for as
    long as the model works. The built-in (``pi_workflows.builtin.executors``) registers
    ``command``, which pipes the step prompt to ``PI_WORKFLOWS_AGENT_COMMAND`` and reads
    JSON from its stdout. Since 0.1 the request and result are typed (TypedDicts, plain
    dicts at run time), so executors written against the dict shape work unchanged.
    """


@hook(REQUIRED)
def piw_step_prompt(contract: StepContract, authored: str) -> str | None:
    """The whole text the model gets for one agent step attempt.

    :param contract: the step's :class:`~pi_workflows.records.StepContract`: run,
        workflow, node and attempt ids, the expected output (``None``: the author gave
        none) and ``completion`` (``submit``).
    :param authored: the node's prompt as the workflow author wrote it (never empty).
    :returns: the prompt, which must tell the model how to finish the step: call the
        ``workflow`` tool once with ``{"action": "submit", "step": <nodeId>, "attempt":
        <attemptId>, "output": ...}`` (interactive runs; the session's extension checks
        ``step`` and ``attempt``) or answer with the output (headless executors).

    Called in the worker each time an agent step attempt starts, for interactive and
    headless runs alike; the text is stored with the attempt, sent to the origin
    session or handed to the agent executor as ``request["prompt"]``. ``firstresult``;
    an answer is required. The built-in (``pi_workflows.builtin.step_prompt``) appends
    the reference contract block to the authored prompt: the ids, the submit call, the
    expected output (default "a JSON object with your result") and that a validation
    error means correcting the output and submitting again.
    """


# --- cli -------------------------------------------------------------------------------


@hook(REGISTRATION)
def piw_register_commands(cli: click.Group) -> None:
    """Add click commands or groups to the ``pi-workflows`` command line.

    Called once when the CLI starts; every implementation runs. A plugin that raises
    here is reported by name and skipped; the rest of the CLI keeps working. No built-in.
    Hosts and workers load the plugin module too but never call this hook: import the
    commands inside the implementation, so that they do not pay for click and what the
    commands use (``plugins/pi-workflows-audit/piw_audit/plugin.py`` shows how).
    """


# --- events ----------------------------------------------------------------------------


@hook(NOTIFICATION)
def piw_run_transition(
    run_id: str,
    old_status: str | None,
    new_status: str,
    detail: str | None,
    workflow_name: str,
    at: int,
) -> None:
    """Notification: a run changed lifecycle status (called after the commit).

    :param old_status: the status announced before, or ``None`` for a new run.
    :param new_status: one of ``queued`` (created), ``claimed`` (a worker is being
        launched), ``running``, ``parked`` (stopped at a durable boundary, resumable),
        ``waiting`` (needs input), ``paused``, or the terminal ``completed``, ``failed``,
        ``timed_out``, ``cancelled``. A resume is ``paused`` → the status it goes on in.
    :param detail: the run's status detail, else the event that made the change
        (``lease.claimed``, ``run.paused``, …).
    :param workflow_name: the run's workflow.
    :param at: when the change committed, epoch ms.

    Delivery: once per change, whatever caused it (host, worker, session, operator), in
    the process that committed it — the host for everything its workers, sessions and
    the CLI's requests to it change; the CLI itself for what it changes with the host
    stopped (it delivers before it exits). Posted right after the commit, so what the
    plugin reads already shows the change, and called on the plugin's own notification
    thread, outside any transaction: each plugin gets its notifications (of every
    notification hook) one at a time, in the order they were posted — a run's ``queued``
    before its ``claimed``, a commit's changes before anything that commit set off. At
    most once: a process killed between the commit and the call never makes it (the
    change is not announced again), and a plugin misses what is announced while one of
    its calls is past the hook deadline (``PI_WORKFLOWS_HOOK_TIMEOUT_MS``, default 1000
    ms; logged once, with the plugin and hook, no arguments) or while 10,000 of its
    notifications wait. Every implementation runs; an exception is logged with the
    plugin's name and never reaches the caller. Nothing waits for the call, but keep it
    fast: a slow plugin falls behind. ``workflow_name`` and
    ``at`` are new in 0.2: an implementation that does not name them still works. No
    built-in.
    """


@hook(NOTIFICATION)
def piw_node_attempt_started(attempt: NodeAttemptRecord) -> None:
    """Notification: an attempt of a node started.

    :param attempt: a :class:`~pi_workflows.records.NodeAttemptRecord` (run, workflow,
        node and kind, attempt id and number, ``started_at``; ``finished_at``,
        ``outcome`` and the error are ``None``).

    Delivery: live, while the run runs — after the commit that recorded the attempt
    (the worker writes it through its host before the node's code runs), in the host
    that supervises the run's worker, outside any transaction, before that commit's
    other consequences. At most once per attempt (a host killed between the commit and
    the call never makes it). Per run, in the order the attempts started, after the
    run's ``running`` transition and before the attempt's
    :func:`piw_node_attempt_finished`. Every implementation runs; an exception is
    logged with the plugin's name and never reaches the caller. Delivered like
    :func:`piw_run_transition`: on the plugin's notification thread, in order with its
    other notifications, under the hook deadline. No built-in.
    """


@hook(NOTIFICATION)
def piw_node_attempt_finished(attempt: NodeAttemptRecord) -> None:
    """Notification: an attempt of a node ended.

    :param attempt: a :class:`~pi_workflows.records.NodeAttemptRecord` with
        ``finished_at`` and ``outcome`` (``completed``, ``failed``, ``timed_out``,
        ``cancelled``, or ``interrupted`` when the worker stopped before the attempt
        ended: parked, paused, crashed or cancelled in the middle of an action); a
        failed attempt's ``error_class`` (the exception's class name, when the node
        raised) and ``error_message``; for an agent step run headless, ``agent``: the
        executor's name and the provider, model and token ``usage`` its result reported
        (see :class:`~pi_workflows.records.AgentStepResult`).

    Delivery: live — after the commit that recorded the outcome, in the host that
    committed it, outside any transaction. The worker sends a finished attempt along
    with its next write (the next node's start, the run's end or a wait), so it arrives
    before the run moves on, and before the run's terminal transition. At most once per
    attempt, after that attempt's :func:`piw_node_attempt_started` (a commit that both
    starts and ends an attempt announces both, in that order). An interrupted attempt is
    announced when the host learns of it: when the run is cancelled, or when the resumed
    worker writes its first snapshot. Every implementation runs; an exception is logged
    with the plugin's name and never reaches the caller. Delivered like the started
    notification. No built-in.
    """


@hook(NOTIFICATION)
def piw_worker_exited(
    run_id: str, outcome: str, exit_code: int | None, signal: int | None, at: int
) -> None:
    """Notification: the worker process of a run ended.

    :param outcome: ``exited`` (it finished its work and said so), ``crashed`` (it died
        or broke the protocol without saying it would), ``cancelled``, ``timedOut`` (it
        did not start in time), ``claimLost`` or ``orphaned`` (the host stopped it).
    :param exit_code: its exit status, or ``None`` when a signal ended it.
    :param signal: the signal that ended it (``9`` for SIGKILL), else ``None``.
    :param at: when the host saw it end, epoch ms.

    Delivery: in the host that supervised the worker, once per worker, after the host
    recorded the exit (a clean exit's record rides on the next commit) and before it
    decides what the run does next (parks, fails or requeues it: that comes as a
    :func:`piw_run_transition`). Delivered like :func:`piw_run_transition`: on the
    plugin's notification thread, in order with its other notifications, under the hook
    deadline, at most once. Read the run with ``pi_workflows.plugin.state_view()`` when
    you need more of it. Every implementation runs; an exception is logged with the
    plugin's name and never reaches the caller. No built-in.
    """
