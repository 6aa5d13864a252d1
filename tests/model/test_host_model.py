"""A real host held to a model: random operations and faults, invariants after every step.

The state machine drives a real host (a process, its SQLite file or a PostgreSQL database,
real workers) through the client library: it starts runs of the workflows in
``workflows.py``, pauses, resumes, cancels and restarts them, answers their checkpoints
and decisions (right, wrong, twice, from two clients at once), resolves effects in doubt,
SIGKILLs workers and the host, stops the host cleanly, and toggles a ``piw_may_claim``
veto. After every step it checks what must always hold; at teardown, with the faults
stopped and every gate open, that every run settles.

Profiles: ``ci`` (the default, bounded) and ``soak`` (``--hypothesis-profile=soak``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.storage import open_state
from pi_workflows.storage.maintenance import state_verify
from pi_workflows.testing import WorkflowHost, short_temp_dir, wait_until
from pi_workflows.testing.host import TERMINAL_STATUSES
from pi_workflows.testing.postgres import PostgresServer

from .workflows import AGENT, VETO_PLUGIN, WORKFLOWS

KINDS = ("chain", "branch", "idempotent", "manual", "checkpoint", "decision", "agent")
AGENT_MODES = ("submits", "rejects", "never")
SETTLE_S = 90.0  # at teardown, how long no run may move before the runs count as stuck
SETTLE_MAX_S = 1800.0
# How long a claim the veto plugin allowed may take to start its worker (a loaded machine).
ASK_TO_START_MS = 10_000


class RunModel:
    """What the test knows of one run lineage (a run, its continuations and restarts)."""

    def __init__(self, key: str, kind: str, run_id: str, run_input: dict[str, Any]) -> None:
        self.key = key
        self.kind = kind
        self.run_ids = [run_id]
        self.input = run_input
        self.statuses: dict[str, list[str]] = {run_id: []}
        self.faults = 0  # kills that could have caught one of its nodes mid-way
        self.restarts = 0
        self.paused_since: float | None = None  # wall-clock ms of the acknowledged pause
        self.vetoed_since: float | None = None  # wall-clock ms the veto file listed it

    @property
    def current(self) -> str:
        return self.run_ids[-1]


class HostModel(RuleBasedStateMachine):
    lineages = Bundle("lineages")
    postgres: PostgresServer | None = None  # set: the host's state lives in PostgreSQL

    def __init__(self) -> None:
        super().__init__()
        self.host = WorkflowHost(short_temp_dir())
        self.log = self.host.root / "effects.log"
        self.veto_file = self.host.root / "veto"
        self.asked_file = self.host.root / "veto-asked"
        self.runs: dict[str, RunModel] = {}
        self.winners: dict[str, set[str]] = {}  # decision id -> accepted choices' run ids
        self.limit = 1
        self.faults_injected = Counter[str]()
        self.database_url: str | None = None

    # --- set-up ------------------------------------------------------------------------

    @initialize(
        target=lineages,
        max_workers=st.sampled_from([1, 2]),
        kind=st.sampled_from(KINDS),
        detail=st.integers(0, 5),
    )
    def start_host_and_a_run(self, max_workers: int, kind: str, detail: int) -> str:
        host = self.host
        self.limit = max_workers
        for name, source in WORKFLOWS.items():
            host.write_workflow(name, source)
        agent = host.root / "agent.py"
        agent.write_text(AGENT)
        host.add_plugin(
            "model_veto", VETO_PLUGIN.format(path=str(self.veto_file), asked=str(self.asked_file))
        )
        # In the home's environment, so a host a later command starts gets them too.
        host.env.update(
            {
                "PI_WORKFLOWS_MAX_WORKERS": str(max_workers),
                "PI_WORKFLOWS_AGENT_EXECUTOR": "command",
                "PI_WORKFLOWS_AGENT_COMMAND": f"{sys.executable} {agent}",
            }
        )
        if self.postgres is not None:  # a fresh database of the test's server per example
            self.database_url = self.postgres.create_database(from_template=True)
            host.env["PI_WORKFLOWS_DATABASE"] = self.database_url
        host.start()
        return self.start_run(kind, detail)

    def teardown(self) -> None:
        try:
            if self.runs:
                self._settle_all()
        finally:
            record_figures(self.faults_injected, len(self.runs))
            self.host.cleanup()
            if self.postgres is not None and self.database_url is not None:
                self.postgres.drop_database(self.database_url)

    # --- talking to the host -----------------------------------------------------------

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One client call; a host that is down is started by the next command first."""
        self._ensure_host()
        client = self.host.client()
        try:
            return getattr(client, method)(*args, **kwargs)
        finally:
            client.close()

    def _ensure_host(self) -> None:
        if self.host._answers():
            return
        # The next command starts a host, as a user's would (autostart from the CLI).
        self.host.cli("run", "list")
        wait_until(self.host._answers, what="the autostarted host")

    def status(self, run_id: str) -> dict[str, Any]:
        return self.call("run_status", run_id)

    # --- rules: runs -------------------------------------------------------------------

    @rule(target=lineages, kind=st.sampled_from(KINDS), detail=st.integers(0, 5))
    def start_run(self, kind: str, detail: int) -> str:
        from pi_workflows.client.start_request import start_payload

        key = uuid.uuid4().hex[:10]
        run_input: dict[str, Any] = {
            "key": key,
            "log": str(self.log),
            "gate": str(self.host.root / f"gate-{key}"),
        }
        if kind == "branch":
            run_input["route"] = ("left", "right")[detail % 2]
        if kind == "agent":
            run_input["mode"] = AGENT_MODES[detail % 3]
        if detail >= 3:  # most runs flow; some wait at their gate for a fault to land
            Path(run_input["gate"]).touch()
        session = None if kind == "agent" else f"model-{key}"  # one unfinished run each
        payload = start_payload(kind, self.host.project, run_input, session_id=session)
        run_id = self.call("start_run", payload)["runId"]
        self.runs[key] = RunModel(key, kind, run_id, run_input)
        return key

    @rule(key=lineages)
    def open_gate(self, key: str) -> None:
        Path(self.runs[key].input["gate"]).touch()

    @rule(key=lineages, pause=st.booleans())
    def pause_or_resume(self, key: str, pause: bool) -> None:
        model = self.runs[key]
        try:
            self.call("pause_run" if pause else "resume_run", model.current)
        except PiWorkflowsError:
            return  # finished, or not paused: a refusal in one line is the answer
        if not pause:
            model.paused_since = None
        elif model.paused_since is None:
            model.paused_since = time.time() * 1000
            # A pause stops the run's worker now, like a kill: the node it was in may run
            # again on resume (an effect in doubt parks instead).
            model.faults += 1

    @rule(key=lineages)
    def cancel(self, key: str) -> None:
        try:
            self.call("cancel_run", self.runs[key].current)
        except PiWorkflowsError:
            pass

    @rule(key=lineages)
    def restart(self, key: str) -> None:
        model = self.runs[key]
        status = self.status(model.current)
        if status["status"] not in TERMINAL_STATUSES or model.kind == "agent":
            return
        try:
            self.call("restart_run", model.current, status["revision"])
        except PiWorkflowsError:
            return  # e.g. its terminal message not shown yet, or effects unsettled
        model.restarts += 1  # its new run names this one as its parent

    # --- rules: answers ----------------------------------------------------------------

    @rule(key=lineages, right=st.booleans(), twice=st.booleans())
    def answer_checkpoint(self, key: str, right: bool, twice: bool) -> None:
        model = self.runs[key]
        answer = dict(model.input) if right else {"not": "the input this workflow reads"}
        for _ in range(2 if twice else 1):
            try:
                receipt = self.call("answer_checkpoint", model.current, answer)
            except PiWorkflowsError:
                continue
            assert model.kind == "checkpoint", f"{model.kind} run took a checkpoint answer"
            assert model.paused_since is None, "a paused run accepted a checkpoint answer"
            self._follow(model, receipt["runId"])

    @rule(key=lineages, choice=st.sampled_from(["ship", "stop", "bogus"]), race=st.booleans())
    def answer_decision(self, key: str, choice: str, race: bool) -> None:
        model = self.runs[key]
        pending = [d for d in self.call("list_decisions") if d["runId"] == model.current]
        if not pending:
            return
        decision_id = pending[0]["decisionId"]
        outcomes: list[Any] = []

        def answer() -> None:
            client = self.host.client()
            try:
                outcomes.append(client.answer_decision(decision_id, choice))
            except Exception as error:  # the host died under the answer
                outcomes.append(error)
            finally:
                client.close()

        threads = [threading.Thread(target=answer) for _ in range(2 if race else 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        accepted = [o for o in outcomes if not isinstance(o, Exception) and o.outcome == "accepted"]
        if choice == "bogus":
            assert not accepted, f"an unknown choice was accepted: {accepted}"
            return
        assert len(accepted) <= 1, f"two answers won decision {decision_id}: {accepted}"
        for response in accepted:
            winners = self.winners.setdefault(decision_id, set())
            winners.add(response.receipt["continuationRunId"])
            # Across rules too: a decision answered once stays answered.
            assert len(winners) == 1, f"decision {decision_id} continued twice: {winners}"
            assert model.paused_since is None, "a paused run accepted a decision answer"
            self._follow(model, response.receipt["continuationRunId"])

    def _follow(self, model: RunModel, run_id: str) -> None:
        if run_id not in model.run_ids:
            model.run_ids.append(run_id)
            model.statuses[run_id] = []

    @rule()
    def resolve_effects(self) -> None:
        """An operator who knows: confirm an effect in doubt the log shows, else retry it."""
        logged = Counter(self.log.read_text().split("\n")) if self.log.exists() else Counter()
        for effect in self.call("list_effects"):
            if effect["status"] != "ambiguous":
                continue
            model = next((m for m in self.runs.values() if effect["runId"] in m.run_ids), None)
            if model is None:
                continue
            node = "manual" if effect["policy"] == "manual" else "effect"
            happened = logged[f"{model.key} {node}"] > 0
            try:
                if happened:
                    self.call("confirm_effect", effect["effectId"])
                else:
                    self.call("retry_effect", effect["effectId"])
            except PiWorkflowsError:
                continue

    # --- rules: faults -----------------------------------------------------------------

    # Which worker is drawn as a number before the rule runs: a draw that depends on what
    # is alive would make Hypothesis's replays draw differently ("flaky strategy").
    @rule(
        fault=st.sampled_from(["worker SIGKILL", "host SIGKILL", "host stop"]),
        which=st.integers(0, 7),
    )
    def inject_fault(self, fault: str, which: int) -> None:
        """SIGKILL a worker, SIGKILL the host (the next command starts one), or stop it."""
        if fault == "worker SIGKILL":
            workers = sorted(self._live_workers())
            if not workers:
                return
            _, pid = workers[which % len(workers)]
            self._note_fault_on_active_runs()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
        else:
            pid = self._host_pid()
            if pid is None:
                return
            self._note_fault_on_active_runs()
            if fault == "host stop":
                self.host.cli("host", "stop")
            else:
                process = psutil.Process(pid)
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)
        self.faults_injected[fault] += 1

    @rule(key=lineages, on=st.booleans())
    def veto(self, key: str, on: bool) -> None:
        vetoed = set(self.veto_file.read_text().split()) if self.veto_file.exists() else set()
        vetoed = vetoed | {key} if on else vetoed - {key}
        self.veto_file.write_text("\n".join(sorted(vetoed)))
        model = self.runs[key]
        if on and model.vetoed_since is None:
            model.vetoed_since = time.time() * 1000
        elif not on:
            model.vetoed_since = None

    # --- invariants --------------------------------------------------------------------

    def _discover_successors(self) -> None:
        """Follow each lineage to the runs that carry it on: a continuation (an answer, a
        decision's deadline) or a restart names its parent."""
        listed = self.call("list_runs", 500)
        for run in sorted(listed, key=lambda r: r["createdAt"]):
            parent = run.get("parentRunId")
            for model in self.runs.values():
                if parent in model.run_ids:
                    self._follow(model, run["runId"])

    @invariant()
    def statuses_move_legally(self) -> None:
        self.faults_injected["steps"] += 1
        self._discover_successors()
        for model in self.runs.values():
            for run_id in model.run_ids:
                try:
                    status = self.status(run_id)["status"]
                except PiWorkflowsError:
                    continue
                seen = model.statuses[run_id]
                if seen and seen[-1] in TERMINAL_STATUSES:
                    assert status == seen[-1], f"run {run_id} left {seen[-1]} for {status}"
                if not seen or seen[-1] != status:
                    seen.append(status)

    @invariant()
    def nodes_and_effects_ran_at_most_as_often_as_allowed(self) -> None:
        if not self.log.exists():
            return
        counts = Counter(tuple(line.split()) for line in self.log.read_text().splitlines())
        for (key, node), count in counts.items():
            model = self.runs.get(key)
            if model is None:
                continue
            if node == "agent":  # a rejected output is asked again: bounded by the engine
                continue
            allowed = 1 + model.restarts
            if node != "manual":  # a kill mid-node may re-run it; a manual effect never
                allowed += model.faults
            assert count <= allowed, (
                f"{model.kind} {key}: node {node} ran {count} times, at most {allowed} "
                f"({model.faults} faults, {model.restarts} restarts)"
            )

    @invariant()
    def one_terminal_message_per_run(self) -> None:
        rows = self._query("SELECT run_id FROM workflow_messages WHERE kind = 'terminal'")
        terminal = Counter(run_id for (run_id,) in rows)
        assert all(count == 1 for count in terminal.values()), terminal

    @invariant()
    def workers_within_the_limit_and_never_for_a_held_run(self) -> None:
        # A worker occupies a slot while its run holds the claim of the worker's generation:
        # a run whose own write released the claim (completed, waiting, ...) frees its slot
        # with that commit, and its worker only exits.
        rows = self._query(
            "SELECT w.run_id, w.started_at, w.host_epoch FROM run_workers w "
            "JOIN leases l ON l.run_id = w.run_id AND l.generation = w.generation "
            "WHERE l.owner_id IS NOT NULL AND w.status IN ('starting', 'ready', 'running')"
        )
        epochs = Counter(epoch for _, _, epoch in rows)
        current = max(epochs) if epochs else None
        active = sorted((run_id, started) for run_id, started, epoch in rows if epoch == current)
        assert len(active) <= self.limit, f"{len(active)} workers, limit {self.limit}: {active}"
        for run_id, started_at, _ in rows:
            model = self._model_of(run_id)
            if model is None:
                continue
            if model.paused_since is not None and started_at >= model.paused_since:
                raise AssertionError(f"{model.kind} run {run_id} got a worker while paused")
            if model.vetoed_since is not None and started_at >= model.vetoed_since:
                assert self._allowed_before_the_veto(model, started_at), (
                    f"{model.kind} run {run_id} got a worker while vetoed"
                )

    def _allowed_before_the_veto(self, model: RunModel, started_at: int) -> bool:
        """True if the veto plugin's last answer for the run before its worker started was
        "allow", given before the veto file listed the run and just before the start: the
        claim pass asked, then the test wrote the veto, then the claim committed."""
        last: tuple[str, int] | None = None
        asked = self.asked_file.read_text() if self.asked_file.exists() else ""
        for line in asked.splitlines():
            key, verdict, at = line.split()
            if key == model.key and int(at) <= started_at:
                last = (verdict, int(at))
        if last is None:
            return False
        verdict, at = last
        assert model.vetoed_since is not None
        return verdict == "allow" and at <= model.vetoed_since and started_at - at < ASK_TO_START_MS

    def _model_of(self, run_id: str) -> RunModel | None:
        return next((m for m in self.runs.values() if run_id in m.run_ids), None)

    @invariant()
    def state_verifies(self) -> None:
        store = open_state(self.host.home, self.database_url, read_only=True)
        try:
            problems = state_verify(store)
        finally:
            store.close()
        assert not problems, problems

    # --- liveness ----------------------------------------------------------------------

    def _settle_all(self) -> None:
        """Faults stopped, holds released: every run ends or is answered and continued."""
        self.veto_file.unlink(missing_ok=True)
        for model in self.runs.values():
            Path(model.input["gate"]).touch()
            model.vetoed_since = None
            if model.paused_since is not None:
                try:
                    self.call("resume_run", model.current)
                except PiWorkflowsError:
                    pass
                model.paused_since = None

        def settled() -> bool:
            self.resolve_effects()
            self._discover_successors()
            for model in self.runs.values():
                status = self.status(model.current)
                if status["status"] in TERMINAL_STATUSES:
                    continue
                if status["status"] == "waiting":
                    if model.kind == "checkpoint":
                        self.answer_checkpoint(model.key, right=True, twice=False)
                    elif model.kind == "decision":
                        self.answer_decision(model.key, choice="ship", race=False)
                    if self.status(model.current)["status"] == "waiting":
                        return False
                    continue
                self._resume_if_parked_as_poison(model)
                return False
            return True

        # Liveness is progress: forty runs on one worker of a starved host take long, but
        # each step moves some run on. Stuck is SETTLE_S without any run changing.
        progress: list[Any] = [None, time.monotonic()]

        def settled_or_stuck() -> bool:
            if settled():
                return True
            mark = self._query("SELECT COUNT(*), COALESCE(SUM(revision), 0) FROM runs")[0]
            if mark != progress[0]:
                progress[:] = [mark, time.monotonic()]
            elif time.monotonic() - progress[1] > SETTLE_S:
                raise AssertionError("stuck")
            return False

        try:
            wait_until(
                settled_or_stuck, timeout=SETTLE_MAX_S, interval=0.2, what="every run to settle"
            )
        except AssertionError:
            unsettled = {
                m.current: self._why(m.current)
                for m in self.runs.values()
                if self.status(m.current)["status"] not in TERMINAL_STATUSES
            }
            raise AssertionError(
                f"runs not settled, none moving for {SETTLE_S} s: {unsettled}\n"
                "host log (end):\n" + self.host.host_log()[-3000:]
            ) from None
        self.statuses_move_legally()
        self.nodes_and_effects_ran_at_most_as_often_as_allowed()
        self.one_terminal_message_per_run()
        self.state_verifies()

    # --- helpers -----------------------------------------------------------------------

    def _query(self, sql: str) -> list[tuple]:
        if self.database_url is None:
            return self.host.query(sql)
        import psycopg2

        connection = psycopg2.connect(self.database_url)
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
                return cursor.fetchall()
        finally:
            connection.close()

    def _resume_if_parked_as_poison(self, model: RunModel) -> None:
        """A run whose workers the test killed twice before it made progress is parked
        (`workerNoProgress`) until an operator resumes it: the test is that operator."""
        try:
            why = self.call("why_run", model.current)
        except PiWorkflowsError:
            return
        if why.get("code") != "workerNoProgress":
            return
        assert model.faults >= 2, f"{model.kind} run {model.current} parked as poison: {why}"
        try:
            self.call("resume_run", model.current)
        except PiWorkflowsError:
            pass

    def _why(self, run_id: str) -> str:
        try:
            why = self.call("why_run", run_id)
        except PiWorkflowsError as error:
            return f"(run why failed: {error})"
        return f"{why['status']}: {why['reason']} [{why.get('code')}]"

    def _live_workers(self) -> set[tuple[str, int]]:
        rows = self._query(
            "SELECT run_id, pid FROM run_workers WHERE status IN ('ready', 'running') "
            "AND pid IS NOT NULL"
        )
        return {(run_id, pid) for run_id, pid in rows if psutil.pid_exists(pid)}

    def _host_pid(self) -> int | None:
        lock = self.host.home.lock_path
        try:
            pid = json.loads(lock.read_text())["pid"]
        except (FileNotFoundError, ValueError, KeyError):
            return None
        return pid if psutil.pid_exists(pid) else None

    def _note_fault_on_active_runs(self) -> None:
        """A fault may re-run the node it catches mid-way, so it allows one more run of a
        node to each lineage with a run not ended. A lineage whose runs had all ended
        (and been found) has no node mid-way: its nodes must not run again."""
        self._discover_successors()
        ended = {
            run["runId"]
            for run in self.call("list_runs", 500)
            if run["status"] in TERMINAL_STATUSES
        }
        for model in self.runs.values():
            if not ended.issuperset(model.run_ids):
                model.faults += 1


FIGURES: Counter[str] = Counter()


def record_figures(faults: Counter[str], runs: int) -> None:
    """Add one example's figures; with PI_WORKFLOWS_MODEL_FIGURES, keep them in that file
    too (a soak is stopped, not finished)."""
    FIGURES["examples"] += 1
    FIGURES["runs"] += runs
    FIGURES.update(faults)
    path = os.environ.get("PI_WORKFLOWS_MODEL_FIGURES")
    if path:
        Path(path).write_text(json.dumps(dict(FIGURES), sort_keys=True) + "\n")


def run_model(request: pytest.FixtureRequest, postgres: PostgresServer | None) -> None:
    profile = request.config.getoption("hypothesis_profile", None) or "ci"
    HostModel.TestCase.settings = settings.get_profile(profile)
    HostModel.postgres = postgres
    try:
        HostModel.TestCase().runTest()
    finally:
        HostModel.postgres = None
        print(f"model figures: {dict(FIGURES)}")


@pytest.mark.integration
def test_a_real_host_on_sqlite_holds_to_the_model(request: pytest.FixtureRequest) -> None:
    run_model(request, None)


@pytest.mark.integration
def test_a_real_host_on_postgresql_holds_to_the_model(
    request: pytest.FixtureRequest, postgres_server: PostgresServer
) -> None:
    run_model(request, postgres_server)
