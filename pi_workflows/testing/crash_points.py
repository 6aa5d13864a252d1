"""The crash-point explorer: kill a workflow's worker or host at every durable boundary.

A durable boundary is a commit of the host's state store that changed one of the run's
records (each worker write and each host decision about the run is one). The explorer:

1. runs the workflow once in a fresh real host, recording its boundaries (the kill point of
   :mod:`pi_workflows.testing.kill_point` in ``record`` mode);
2. then, for each boundary, each side of its commit (``before``, ``after``) and each target
   (``worker``, ``host``), runs it again in a fresh host armed to SIGKILL that target there,
   starts a new host after a host kill (as the next command would), and lets recovery
   finish;
3. checks each of those runs against the first: the same final status and output, each
   effect applied as often as in the first run (the author's ``effects`` reader), exactly
   one terminal message per terminal interactive run, no run left unsettled, and
   ``state verify`` clean.

Waiting runs are answered by the caller's ``answer`` callback; agent steps, when the case
gives ``agent_replies``, run headless on the ``command`` executor with those replies. A
worker killed after it started but before it committed any progress leaves its run parked
(``workerNoProgress``, SPEC §7.4) until an operator resumes it: the explorer does, once per
run, as that operator (`Trial.resumed`).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..client.start_request import start_payload
from ..storage.database import KILL_POINT_ENV
from ..storage.run_claims import NO_PROGRESS_CODE
from .host import HOST_START_TIMEOUT_S, TERMINAL_STATUSES, WorkflowHost, short_temp_dir
from .polling import wait_until

WHEN = ("before", "after")
TARGETS = ("worker", "host")
SESSION = "crash-points"
HOST_LOG_LINES = 40  # of a stranded trial's host log, in its failure
# How long `channel_effects` waits for a settlement that follows a run's end.
CHANNEL_EFFECTS_WAIT_S = 15.0

# The headless agent: answers each step with the reply its node id maps to.
_AGENT_SCRIPT = """\
import json, os, sys
sys.stdin.read()
replies = json.load(open({path!r}))
print(json.dumps(replies[os.environ["PI_WORKFLOWS_NODE_ID"]]))
"""


@dataclass
class CrashCase:
    """One workflow run the explorer repeats, and how to drive it to its end.

    - `input_for(host)`: the input, for one that names the execution's own files (the
      home is new each time); else `input`;
    - `prepare(host)`: write workflows, plugins or ``channels.toml`` before the host starts;
    - `answer(host, status)`: called (again and again, until it settles) for a run that
      waits without a continuation; answer its checkpoint or decision through
      ``host.client()``; an answer that comes too late or twice is harmless;
    - `effects(host)`: how often each of your effects happened (read your side-effect log);
    - `resolve(host)`: the operator's part, called on every pass until the runs settle:
      an effect a host died applying is in doubt (``ambiguous``) until someone who knows
      confirms or retries it (``host.client().confirm_effect`` / ``retry_effect``);
    - `agent_replies`: node id -> output of each agent step (the run goes headless);
    - `host_env`: more environment for every host of the case.
    """

    workflow: str
    input: Any = None
    input_for: Callable[[WorkflowHost], Any] | None = None
    prepare: Callable[[WorkflowHost], None] | None = None
    answer: Callable[[WorkflowHost, dict[str, Any]], None] | None = None
    effects: Callable[[WorkflowHost], Mapping[str, int]] | None = None
    agent_replies: Mapping[str, Any] | None = None
    resolve: Callable[[WorkflowHost], None] | None = None
    host_env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 60.0

    @property
    def interactive(self) -> bool:
        return self.agent_replies is None


@dataclass(frozen=True)
class Boundary:
    number: int
    events: Mapping[str, str]  # run id -> the latest event its commit wrote
    last_event: int  # the number of that event among all the execution's run events
    has_worker: bool  # a worker of those runs was alive at the commit

    @property
    def kind(self) -> frozenset[str]:
        """The run events its commit wrote: boundaries of one kind die and recover alike."""
        return frozenset(self.events.values())

    def describe(self) -> str:
        return f"#{self.number} ({', '.join(sorted(self.kind))})"


@dataclass(frozen=True)
class Outcome:
    """What one execution of a case ended with, in terms comparable across executions."""

    results: tuple[tuple[str, Any], ...]  # (status, finalOutput) of each run without a child
    effects: Mapping[str, int]
    problems: tuple[str, ...]  # broken promises found without comparing (messages, verify)


@dataclass(frozen=True)
class Trial:
    boundary: Boundary
    when: str
    target: str
    killed: tuple[int, ...]  # the pids killed; empty: no such process at that boundary
    failures: tuple[str, ...]
    # Runs the killed worker left parked without progress, given an operator's resume.
    resumed: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.target} killed {self.when} boundary {self.boundary.describe()}"


@dataclass
class CrashReport:
    workflow: str
    boundaries: list[Boundary]
    trials: list[Trial] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(1 for trial in self.trials if trial.killed)

    @property
    def failures(self) -> list[Trial]:
        return [trial for trial in self.trials if trial.failures]

    def summary(self) -> str:
        """One line of figures, then one line per failure naming its boundary."""
        with_worker = sum(1 for boundary in self.boundaries if boundary.has_worker)
        targets = sorted({trial.target for trial in self.trials})
        lines = [
            f"{self.workflow}: {len(self.boundaries)} boundaries ({with_worker} with a live "
            f"worker), {len(self.trials)} trials killing {'/'.join(targets)}, "
            f"{self.kills} kills ({len(self.trials) - self.kills} found nothing to kill), "
            f"{len(self.failures)} failures"
        ]
        for trial in self.failures:
            lines.append(f"  {trial.describe()}: {'; '.join(trial.failures)}")
        return "\n".join(lines)

    def assert_clean(self) -> None:
        """Raise with the summary unless every trial held every promise."""
        if self.failures:
            raise AssertionError(self.summary())


def explore_crash_points(
    case: CrashCase,
    *,
    targets: tuple[str, ...] = TARGETS,
    where: Callable[[Boundary], bool] | None = None,
    host_factory: Callable[[Path], WorkflowHost] = WorkflowHost,
) -> CrashReport:
    """Record `case`'s boundaries, kill each of `targets` on both sides of each (of those
    `where` accepts), report."""
    with _Execution(case, host_factory, None) as first:
        baseline = first.outcome
        boundaries = first.boundaries()
    report = CrashReport(case.workflow, boundaries)
    if baseline.problems:
        raise AssertionError(f"{case.workflow} fails without any kill: {baseline.problems}")
    for boundary in boundaries:
        if where is not None and not where(boundary):
            continue
        for target in targets:
            if target == "worker" and not boundary.has_worker:
                continue  # nothing to kill (the claim, before its worker runs; an answer)
            for when in WHEN:
                spec = {"mode": "kill", "event": boundary.last_event, "when": when}
                report.trials.append(
                    _trial(case, host_factory, baseline, boundary, {**spec, "target": target})
                )
    return report


def _trial(
    case: CrashCase,
    host_factory: Callable[[Path], WorkflowHost],
    baseline: Outcome,
    boundary: Boundary,
    spec: dict[str, Any],
) -> Trial:
    execution = _Execution(case, host_factory, spec)
    try:
        with execution:
            failures = [*execution.outcome.problems, *_compare(baseline, execution.outcome)]
    except AssertionError as error:  # stranded: the run never settled
        failures = [str(error)]
    killed = execution.killed
    if killed is None:
        failures.append("the kill point was never reached")
    return Trial(
        boundary,
        spec["when"],
        spec["target"],
        tuple(killed or ()),
        tuple(failures),
        tuple(execution.resumed),
    )


def first_of_each_kind() -> Callable[[Boundary], bool]:
    """A `where` for :func:`explore_crash_points` that accepts the first boundary of each
    kind (:attr:`Boundary.kind`) and no later one of the same kind (boundaries come in
    order): every kind of crash point once, for a fraction of the trials."""
    seen: set[frozenset[str]] = set()

    def first(boundary: Boundary) -> bool:
        if boundary.kind in seen:
            return False
        seen.add(boundary.kind)
        return True

    return first


@dataclass(frozen=True)
class CrashPoints:
    """What the ``crash_points`` fixture gives: the explorer, and the mode pytest runs in.

    By default (``--crash-points=ci``) each case is killed at the first boundary of each
    kind; with ``--crash-points=full`` (``full``) at every boundary, and tests kill hosts
    as well as workers then.
    """

    full: bool = False

    def explore(
        self,
        case: CrashCase,
        *,
        targets: tuple[str, ...] = TARGETS,
        where: Callable[[Boundary], bool] | None = None,
    ) -> CrashReport:
        if self.full:
            return explore_crash_points(case, targets=targets, where=where)
        first = first_of_each_kind()

        def chosen(boundary: Boundary) -> bool:
            return (where is None or where(boundary)) and first(boundary)

        return explore_crash_points(case, targets=targets, where=chosen)


def _compare(expected: Outcome, actual: Outcome) -> list[str]:
    failures = []
    if actual.results != expected.results:
        failures.append(f"ended with {actual.results}, not {expected.results}")
    if dict(actual.effects) != dict(expected.effects):
        failures.append(f"effects applied {dict(actual.effects)}, not {dict(expected.effects)}")
    return failures


class _Execution:
    """One run of a case in a fresh home, armed with `spec` (None: recording)."""

    def __init__(
        self,
        case: CrashCase,
        host_factory: Callable[[Path], WorkflowHost],
        spec: dict[str, Any] | None,
    ) -> None:
        self.case = case
        self.host = host_factory(short_temp_dir())
        self.spec_path = self.host.root / "kill-point.json"
        self.spec_path.write_text(json.dumps(spec or {"mode": "record"}))
        self.outcome = Outcome((), {}, ())
        self._armed_host: Any = None
        self.killed: list[int] | None = None  # read before the home is deleted
        self.resumed: list[str] = []  # runs the operator's `run resume` carried on

    def __enter__(self) -> _Execution:
        try:
            self._prepare()
            self.outcome = self._drive()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.killed = self._killed()
        self.host.cleanup()

    def boundaries(self) -> list[Boundary]:
        path = self.spec_path.with_name(self.spec_path.name + ".boundaries")
        lines = path.read_text().splitlines() if path.exists() else []
        return [
            Boundary(entry["boundary"], entry["events"], entry["lastEvent"], bool(entry["workers"]))
            for entry in map(json.loads, lines)
        ]

    def _killed(self) -> list[int] | None:
        """The pids the kill point killed (empty: nothing to kill); None: it never fired."""
        path = self.spec_path.with_name(self.spec_path.name + ".fired")
        return json.loads(path.read_text())["pids"] if path.exists() else None

    def _parked_by_the_kill(self, run: dict[str, Any]) -> bool:
        """A run whose worker this execution killed before it made progress: SPEC §7.4
        parks it (`workerNoProgress`) for an operator's `run resume`, which the explorer
        gives once per run. A second such park, or one without a worker killed, stays
        stranded."""
        return (
            run["errorCode"] == NO_PROGRESS_CODE
            and run["runId"] not in self.resumed
            and bool(self._killed())
            and not self._host_killed()
        )

    def _host_killed(self) -> bool:
        path = self.spec_path.with_name(self.spec_path.name + ".fired")
        return path.exists() and json.loads(path.read_text())["target"] == "host"

    # --- driving ---------------------------------------------------------------------

    def _prepare(self) -> None:
        case, host = self.case, self.host
        if case.prepare is not None:
            case.prepare(host)
        self.env = dict(case.host_env)
        if case.agent_replies is not None:
            replies = self.host.root / "agent-replies.json"
            replies.write_text(json.dumps(dict(case.agent_replies)))
            script = self.host.root / "agent.py"
            script.write_text(_AGENT_SCRIPT.format(path=str(replies)))
            self.env["PI_WORKFLOWS_AGENT_EXECUTOR"] = "command"
            self.env["PI_WORKFLOWS_AGENT_COMMAND"] = f"{sys.executable} {script}"
        self.payload = start_payload(
            case.workflow,
            host.project,
            case.input if case.input_for is None else case.input_for(host),
            session_id=SESSION if case.interactive else None,
        )

    def _ensure_host(self, armed: bool) -> None:
        process = self.host.host_process
        if process is not None and process.poll() is None:
            if process is not self._armed_host or not self._host_killed():
                return
            process.wait(timeout=30)  # SIGKILLed by the kill point: gone in a moment
        if process is not None:
            self.host.stop()  # reaps it, and kills any host it left
        extra = {KILL_POINT_ENV: str(self.spec_path)} if armed else {}
        started = self.host.start(timeout=HOST_START_TIMEOUT_S, **self.env, **extra)
        if armed:
            self._armed_host = started

    def _drive(self) -> Outcome:
        deadline = time.monotonic() + self.case.timeout
        self._ensure_host(armed=True)
        run_id = None
        while run_id is None:
            run_id = self._start_once()
            if time.monotonic() > deadline:
                raise AssertionError(f"could not start {self.case.workflow}")
        runs = self._settle(deadline)
        return self._outcome(runs)

    def _start_once(self) -> str | None:
        """Start the run; None when the host died first (it is restarted, then looked at)."""
        try:
            with closing(self.host.client()) as client:
                return client.start_run(self.payload)["runId"]
        except Exception:
            self._ensure_host(armed=False)
            with closing(self.host.client()) as client:
                runs = client.list_runs()
            return runs[0]["runId"] if runs else None  # the start committed before the kill

    def _settle(self, deadline: float) -> list[dict[str, Any]]:
        """Drive until every run is terminal or answered and continued; the runs."""
        runs: list[dict[str, Any]] = []
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self._ensure_host(armed=False)
                with closing(self.host.client()) as client:
                    runs = client.list_runs()
                if self.case.resolve is not None:
                    self.case.resolve(self.host)
                waiting = _unsettled(runs)
                if not waiting:
                    return runs
                for run in waiting:
                    if run["status"] == "waiting" and self.case.answer is not None:
                        self.case.answer(self.host, run)
                    elif self._parked_by_the_kill(run):
                        with closing(self.host.client()) as client:
                            client.resume_run(run["runId"])
                        self.resumed.append(run["runId"])
            except Exception as error:  # the host died under us: the next pass starts one
                last_error = error
            time.sleep(0.05)
        stranded = ", ".join(f"{run['runId']} {run['status']}" for run in _unsettled(runs))
        # The host's last words: a stranded run is otherwise a name and a status alone.
        log_tail = "\n".join(self.host.host_log().splitlines()[-HOST_LOG_LINES:])
        raise AssertionError(
            f"runs not settled after {self.case.timeout:g} s: {stranded or 'none listed'}"
            + (f" (last error: {last_error!r})" if last_error is not None else "")
            + f"\nthe host's log, last {HOST_LOG_LINES} lines:\n{log_tail}"
        )

    def _outcome(self, runs: list[dict[str, Any]]) -> Outcome:
        parents = {run["parentRunId"] for run in runs}
        results = tuple(
            sorted(
                (run["status"], json.dumps(run["finalOutput"], sort_keys=True))
                for run in runs
                if run["runId"] not in parents
            )
        )
        problems = list(self._message_problems(runs)) if self.case.interactive else []
        verify = self.host.cli("state", "verify", check=False)
        if verify.returncode != 0:
            problems.append(f"state verify: {verify.stdout.strip()} {verify.stderr.strip()}")
        effects = self.case.effects(self.host) if self.case.effects is not None else {}
        return Outcome(results, dict(effects), tuple(problems))

    def _message_problems(self, runs: list[dict[str, Any]]) -> list[str]:
        messages = self.host.session_messages(SESSION)
        problems = []
        for run in runs:
            terminal = [
                m for m in messages if m["runId"] == run["runId"] and m["kind"] == "terminal"
            ]
            expected = 1 if run["status"] in TERMINAL_STATUSES else 0
            if len(terminal) != expected:
                problems.append(
                    f"run {run['runId']} ({run['status']}) has {len(terminal)} terminal "
                    f"messages, not {expected}"
                )
        return problems


def _unsettled(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs neither terminal nor waiting with a continuation that carries them on."""
    parents = {run["parentRunId"] for run in runs}
    return [
        run
        for run in runs
        if run["status"] not in TERMINAL_STATUSES
        and not (run["status"] == "waiting" and run["runId"] in parents)
    ]


def channel_effects(host: WorkflowHost) -> Counter[str]:
    """An `effects` reader for decision channels: per decision, how often each channel's
    delivery and settlement took hold (the host's ledger), as the set of counts seen.

    Each must be once for every decision. How many decisions there are may differ between
    executions: a worker killed while its node asked a human asks again in a new attempt,
    a decision of its own (the first one is settled as superseded). That settlement goes
    out through the host's channel runner and may take hold after the run has ended, so
    the reader waits (up to `CHANNEL_EFFECTS_WAIT_S`) until every decision has each kind
    of effect, then counts.
    """
    counts: dict[tuple[str, str, str], int] = {}

    def complete() -> bool:
        nonlocal counts
        counts = _per_decision(_applied_channel_effects(host))
        return all(counts.values())

    try:
        wait_until(complete, timeout=CHANNEL_EFFECTS_WAIT_S, what="every channel effect")
    except AssertionError:
        pass  # counted as they are: the comparison with the first execution names the gap
    return Counter(
        {
            f"{channel} {kind} applied {count} times": 1
            for (_, channel, kind), count in counts.items()
        }
    )


def _applied_channel_effects(host: WorkflowHost) -> Counter[tuple[str, str, str]]:
    with closing(host.client()) as client:
        return Counter(
            (effect["decisionId"], effect["channel"], effect["effectType"])
            for effect in client.list_effects()
            if effect["scope"] == "channel" and effect["status"] == "applied"
        )


def _per_decision(
    applied: Counter[tuple[str, str, str]],
) -> dict[tuple[str, str, str], int]:
    """Every (decision, channel, kind) that some decision had applied, with its count."""
    kinds = {(channel, kind) for _, channel, kind in applied}
    decisions = {decision for decision, _, _ in applied}
    return {
        (decision, channel, kind): applied[(decision, channel, kind)]
        for decision in decisions
        for channel, kind in kinds
    }
